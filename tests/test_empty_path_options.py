"""An empty path given to any CLI option or argument is refused, naming the option.

``Path("")`` is ``.``: before the fix ``shepherd simulate --trace ''`` said "'.' is a
directory", ``shepherd report --data-dir ''`` spoke of ``'.'``, and ``shepherd server
--data-dir "$UNSET"`` kept its database in the current folder. The class: every path
parameter goes through ``cli.daemon.path_param``; the walk below finds any that does not.
"""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from gpushepherd.cli.daemon import path_param
from gpushepherd.cli.main import app

REFUSAL = "'' is not allowed: a path"


def path_parameters():
    """``(command, parameter, its typer.Option/Argument)`` of every parameter of every CLI
    command whose type is ``Path``, ``Optional[Path]`` or ``list[Path]`` (read from the
    commands' annotations: typer's public registry, not its vendored click)."""
    def walk(t: typer.Typer, path: str):
        for c in t.registered_commands:
            name = c.name or c.callback.__name__.replace("_", "-")
            hints = typing.get_type_hints(c.callback, include_extras=True)
            for param, hint in sorted(hints.items()):
                if typing.get_origin(hint) is not typing.Annotated:
                    continue
                base, *meta = typing.get_args(hint)
                if Path in (base, *typing.get_args(base)):
                    info = next(m for m in meta if isinstance(m, typer.models.ParameterInfo))
                    yield f"{path} {name}", param, info
        for g in t.registered_groups:
            yield from walk(g.typer_instance, f"{path} {g.name}")
    yield from walk(app, "shepherd")


def test_every_path_parameter_refuses_an_empty_path():
    params = list(path_parameters())
    plain = [f"{where} {param}" for where, param, info in params if info.parser is not path_param]
    assert plain == [], f"path parameters without path_param (they take '' as '.'): {plain}"
    named = {f"{where} {param}" for where, param, _ in params}
    assert len(named) >= 17 and {"shepherd simulate trace", "shepherd server data_dir",
                                 "shepherd policy check files"} <= named, sorted(named)


@pytest.mark.parametrize("args, option", [
    (["simulate", "--trace", "", "--no-progress"], "'--trace'"),
    (["simulate", "--policy", ""], "'--policy'"),
    (["server", "--data-dir", ""], "'--data-dir'"),
    (["report", "--data-dir", ""], "'--data-dir'"),
    (["whatif", "--policy", ""], "'--policy'"),
    (["policy", "check", ""], "'FILE...'"),
    (["scenario", "run", ""], "'FILE...'"),
    (["submit", "--chdir", "", "--", "true"], "'--chdir'"),
])
def test_an_empty_path_is_refused_naming_its_option(args, option, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    assert option in r.stderr and REFUSAL in r.stderr, r.stderr
    assert "'.'" not in r.stderr
    assert list(tmp_path.iterdir()) == []  # nothing was made in the current folder (a server's data dir)

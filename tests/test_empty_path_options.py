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


@pytest.mark.parametrize("option", ["-D", "--chdir", "-o", "--output", "-e", "--error"])
def test_sbatch_refuses_an_empty_path_on_its_command_line_and_in_its_script(option, tmp_path, monkeypatch):
    # review: sbatch parses its own options (Slurm's), past path_param: -D '' was the
    # current folder and -o '' / -e '' were dropped, the job submitted
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/bash\n#SBATCH -p batch\n#SBATCH -A research\ntrue\n")
    r = CliRunner().invoke(app, ["sbatch", option, "", "job.sh"])
    assert r.exit_code == 2 and f"command line: {option} '' is not allowed: a path" in r.stderr, r.stderr
    (tmp_path / "in.sh").write_text(f"#!/bin/bash\n#SBATCH -p batch\n#SBATCH {option} ''\ntrue\n")
    r = CliRunner().invoke(app, ["sbatch", "-A", "research", "in.sh"])
    assert r.exit_code == 2 and f"in.sh:3: {option} '' is not allowed: a path" in r.stderr, r.stderr


@pytest.mark.parametrize("where", ["folder", "missing"])
def test_policy_export_to_a_path_it_cannot_write_is_one_line_not_a_traceback(where, tmp_path):
    # a tester's find: -o naming a folder, or a file in a missing folder, ended in a traceback
    target = tmp_path if where == "folder" else tmp_path / "missing" / "k.yaml"
    policy = Path(__file__).resolve().parent.parent / "examples" / "policies" / "small-team.yaml"
    r = CliRunner().invoke(app, ["policy", "export", str(policy), "--kueue", "-o", str(target)])
    assert r.exit_code == 2 and r.stderr.startswith(f"error: --output: {str(target)!r} cannot be written"), r.stderr
    assert "Traceback" not in r.stderr + r.stdout

"""A value an option's type refuses ("2h" for --load, "1.5" for --bf-depth) gives one
line naming the option, the value and what is allowed, as every other bad option does.
typer >= 0.2x checks an option's type with pydantic, whose message named neither the
value nor a form to write ("Invalid value for '--load': Input should be a valid number,
unable to parse string as a number")."""

import subprocess
import sys

import pytest


def shepherd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", *args], capture_output=True, text=True)


@pytest.mark.parametrize("args, line", [
    (("simulate", "--load", "2h"), "error: --load: '2h' is not allowed: a number (see --help)"),
    (("simulate", "--load", ""), "error: --load: '' is not allowed: a number (see --help)"),
    (("simulate", "--bf-depth", "1.5"), "error: --bf-depth: '1.5' is not allowed: a whole number (see --help)"),
    (("submit", "-G", "1e309", "--", "true"), "error: --gpus: '1e309' is not allowed: a whole number (see --help)"),
    (("submit", "-G", "0", "--", "true"),
     "error: --gpus: '0' is not allowed: input should be greater than or equal to 1 (see --help)"),
])
def test_a_value_the_option_type_refuses_is_named(args, line):
    proc = shepherd(*args)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [line]


def test_click_usage_errors_are_unchanged():
    proc = shepherd("simulate", "--no-such-option")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: No such option: --no-such-option")

"""`shepherd --version` / `-V` and `-h` on every command, as most CLIs have them (a
newcomer looked for both). Run as the console script is run (``cli.main.run``)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from gpushepherd import __version__


def _shepherd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_flag(flag):
    r = _shepherd(flag)
    assert r.returncode == 0 and r.stdout.strip() == f"gpushepherd {__version__}", r


@pytest.mark.parametrize("args", [("-h",), ("simulate", "-h"), ("policy", "check", "-h"), ("submit", "-h")])
def test_short_help_on_every_level(args):
    r = _shepherd(*args)
    assert r.returncode == 0 and r.stdout.startswith("Usage: "), r
    assert r.stdout == _shepherd(*args[:-1], "--help").stdout

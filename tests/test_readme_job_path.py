"""The README says which PATH a job of a server run as root starts with (a newcomer's
`-- python train.py` failed with exit 127 on a host whose /usr/bin has only python3):
the text must stay the one ``runas.clean_env`` gives, and a job's ``--env`` must win."""

from __future__ import annotations

from pathlib import Path

from gpushepherd.daemon import runas

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_names_the_path_a_job_starts_with():
    text = " ".join(README.read_text().split())
    assert f"whose `PATH` is `{runas.DEFAULT_PATH}` plus the job's `--env`" in text


def test_a_jobs_env_path_wins_over_the_default():
    ident = runas.Identity("ana", 1000, 1000, (1000,), "/home/ana", "/bin/bash")
    assert runas.clean_env(ident, {}, server_env={"PATH": "/opt/x"})["PATH"] == runas.DEFAULT_PATH
    assert runas.clean_env(ident, {"PATH": "/home/ana/venv/bin"}, server_env={})["PATH"] == "/home/ana/venv/bin"

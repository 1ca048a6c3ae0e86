"""``shepherd submit -c batch -A vision /tmp/x/j4.sh`` (a script that is not executable,
given with a path) said "Submitted job 13" and the job failed at launch: only a bare
name in the job's directory was refused. A path (absolute or relative to ``-D``) to a
file that is not executable is refused the same way, pointing to ``sbatch`` and
``chmod +x``; an executable one, or a path to no file here, is submitted."""

from __future__ import annotations

import os

import test_regressions_api as regressions
from test_sbatch import script

api, cli = regressions.api, regressions.cli  # fixtures: an in-process server, the CLI against it


def test_a_path_to_a_script_that_is_not_executable_is_refused(cli, api, tmp_path):
    p = script(tmp_path, "-p batch")
    os.chmod(p, 0o644)
    for given in (str(p), "./job.sh"):
        code, out, err = cli("submit", "-c", "batch", "-A", "research", "-D", str(tmp_path), given)
        assert code == 2 and out == "", (given, out, err)
        assert f"{given!r} is not allowed: it is a file that is not executable" in err, err
        assert f"shepherd sbatch {given}" in err and f"chmod +x {given}" in err
    assert api.get("/jobs").json() == []


def test_an_executable_script_or_no_file_here_is_submitted(cli, api, tmp_path):
    p = script(tmp_path, "-p batch")
    os.chmod(p, 0o755)
    code, out, err = cli("submit", "-c", "batch", "-A", "research", "-D", str(tmp_path), str(p))
    assert code == 0 and out.startswith("Submitted job "), err
    code, out, err = cli("submit", "-c", "batch", "-A", "research", "-D", str(tmp_path), str(tmp_path / "elsewhere.sh"))
    assert code == 0 and out.startswith("Submitted job "), err  # the server's machine may have it

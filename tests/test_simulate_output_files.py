"""shepherd simulate's output files (--out, --json, --html): an unwritable path is
refused before the replay, a write that still fails at the end is one error line, a
missing folder is made only when the file is written, and files get the mode a plain
open() gives (0666 less the umask), not mkstemp's 0600."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpushepherd.cli.main import UsageError, _write_atomically, app

runner = CliRunner()
PROC = Path("/proc/self").exists()


def trace(tmp_path: Path) -> Path:
    p = tmp_path / "t.csv"
    p.write_text("id,t,n,d\na,1,1,50\nb,2,2,60\n")
    return p


def simulate(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "simulate", "--no-progress", "--trace",
                           str(trace(tmp_path)), "--format", "csv", "--map", "id=id,submit=t,gpus=n,duration=d",
                           *args], capture_output=True, text=True)


@pytest.mark.skipif(not PROC, reason="needs Linux's /proc")
@pytest.mark.parametrize("option, name", [("--out", "x.csv"), ("--json", "x.json")])
def test_a_folder_that_takes_no_file_is_refused_before_the_replay(tmp_path, option, name):
    # /proc passes os.access(W_OK) for root, but no file can be made there: it was
    # refused only at the end, with a FileNotFoundError traceback, the results lost
    proc = simulate(tmp_path, option, f"/proc/{name}")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Replaying" not in proc.stdout
    assert proc.stderr.strip().splitlines() == [
        f"error: {option}: '/proc/{name}' is not allowed: '/proc' takes no new file (No such file or directory); "
        "a path in a folder you can write to"]


@pytest.mark.skipif(not PROC, reason="needs Linux's /proc")
def test_a_write_that_fails_at_the_end_is_a_usage_error_not_a_traceback():
    with pytest.raises(UsageError, match=r"^--out: '/proc/x\.csv' cannot be written \(No such file or directory\)"):
        _write_atomically(Path("/proc/x.csv"), "--out", lambda p: p.write_text("x"))


def test_a_missing_folder_is_made_only_when_the_file_is_written(tmp_path):
    out = tmp_path / "new" / "sub" / "o.csv"
    res = runner.invoke(app, ["simulate", "--no-progress", "--trace", str(trace(tmp_path)), "--format", "csv",
                              "--map", "id=id,submit=t,gpus=n,duration=d", "--out", str(out),
                              "--explain", "no-such-job"], catch_exceptions=False)
    assert res.exit_code == 2 and "--explain" in res.output
    assert not (tmp_path / "new").exists()  # refused before writing: no stray folder
    proc = simulate(tmp_path, "--out", str(out), "--json", str(tmp_path / "j" / "s.json"))
    assert proc.returncode == 0, proc.stderr
    assert out.is_file() and (tmp_path / "j" / "s.json").is_file()


def test_a_file_where_a_folder_should_be_is_refused(tmp_path):
    (tmp_path / "afile").write_text("x")
    proc = simulate(tmp_path, "--json", str(tmp_path / "afile" / "deeper" / "s.json"))
    assert proc.returncode == 2 and "Replaying" not in proc.stdout
    assert f"is a file, not a folder; a path in a folder you can write to" in proc.stderr


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_output_files_get_the_mode_open_gives(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        out, js = tmp_path / "o.csv", tmp_path / "s.json"
        proc = simulate(tmp_path, "--out", str(out), "--json", str(js))
        assert proc.returncode == 0, proc.stderr
        assert stat.S_IMODE(out.stat().st_mode) == mode and stat.S_IMODE(js.stat().st_mode) == mode
    finally:
        os.umask(old)


def test_an_existing_file_keeps_its_mode(tmp_path):
    js = tmp_path / "s.json"
    js.write_text("{}")
    js.chmod(0o660)
    proc = simulate(tmp_path, "--json", str(js))
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(js.stat().st_mode) == 0o660 and js.read_text() != "{}"


def test_help_says_missing_folders_are_made():
    res = runner.invoke(app, ["simulate", "--help"], catch_exceptions=False, terminal_width=400)
    text = " ".join(res.output.split())
    for option in ("--out", "--json", "--html"):
        part = text.split(f"{option} FILE", 1)[1].split(" --", 1)[0]
        assert "its folder is made if missing, when the file is written" in part, option

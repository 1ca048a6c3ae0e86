"""`shepherd simulate --days` is checked with the other options, before the trace is
read: `--days ""` is refused (it replayed the whole trace, as if no window had been
given), and a bad window is named even when the trace itself could not be used (it
was judged only after the whole trace had been read)."""

import subprocess
import sys

DAYS = ("error: --days: {!r} is not allowed: N (days 0 to N) or A:B (days A to B); days count from the "
        "trace's time origin (submit time 0), not from its first job")


def simulate(tmp_path, body: str, days: str) -> subprocess.CompletedProcess:
    (tmp_path / "t.csv").write_text(body)
    return subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "simulate", "--no-progress", "--trace",
                           str(tmp_path / "t.csv"), "--format", "csv", "--map", "submit=t,gpus=n,duration=d",
                           "--days", days], capture_output=True, text=True)


def test_an_empty_days_window_is_refused(tmp_path):
    proc = simulate(tmp_path, "t,n,d\n0,1,10\n", "")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [DAYS.format("")]


def test_a_bad_window_is_named_before_the_trace_is_read(tmp_path):
    proc = simulate(tmp_path, "t,n,d\n0,0,10\n", "2h")  # num_gpu=0: a bad row too
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [DAYS.format("2h")]


def test_a_good_window_still_selects(tmp_path):
    proc = simulate(tmp_path, "t,n,d\n0,1,10\n200000,1,10\n", "0:1")
    assert proc.returncode == 0, proc.stderr
    assert "Replaying 1 job " in " ".join(proc.stdout.split())

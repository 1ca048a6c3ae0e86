"""The API bench still runs end to end against the product (a tiny run, no figures
asserted: speed is a benchmark, not a test). It injects its own stub backend, so an
interface change that breaks it must fail here, not in the next benchmark run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_api_submit_bench_runs_and_every_job_starts():
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "api_submit.py"), "--jobs", "40", "--warmup", "8"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "cannot start" not in out and "Traceback" not in out, out
    assert "not started by the end:         0" in out, out


def test_restart_bench_runs_and_the_snapshot_start_reads_the_log_it_wrote():
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "restart.py"), "600", "--policies", "3"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "Traceback" not in out, out
    assert "2. from the snapshot, after a clean stop" in out and "3. after kill -9" in out, out


def test_fault_campaign_runs_a_few_kill_points_and_everything_holds():
    """A short campaign (8 kill points, 2 during the server's start, no fuzzing): the
    acceptance's bench must keep running, and what it checks must keep holding."""
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "fault_campaign.py"), "--kills", "8",
                        "--startup-kills", "2", "--skip-fuzz"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    out = p.stdout + p.stderr
    assert "Traceback" not in out, out
    assert '"lost": 0' in out and '"doubled": 0' in out and '"relaunch_loops": 0' in out, out
    assert '"refused": 0' in out and '"acknowledged": 0' not in out, out  # it checked something
    assert p.returncode == 0 and "verdict: all held" in out, out


def test_estimate_accuracy_bench_runs_a_row_per_estimate_kind():
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "estimate_accuracy.py"), "--schedulers", "slurm-default",
                        "--factors", "limit,1"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "Traceback" not in out, out
    rows = [line.split() for line in out.splitlines() if line.startswith("slurm-default")]
    assert [r[1] for r in rows] == ["limit", "1x"], out
    assert all(float(r[2]) >= 1.0 for r in rows), out  # JCT over its lower bound


def test_reasons_bench_replays_a_daemons_log_with_epoch_times(tmp_path):
    """`bench/reasons.py --db` checks the reasons of a live run from its event log. The
    log here is a daemon's at epoch times, with a preemptor waiting for a victim too young
    to evict: its reason names that instant (it read `t=1.79654e+09`, a day early)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from builders import job, policy_dict
    from gpushepherd.daemon.store import Store
    from gpushepherd.model.events import JobSubmitted

    t0 = 1_796_541_000.25
    store = Store(Store.sqlite_url(tmp_path))
    try:
        store.append_policy(t0, policy_dict([("n1", 4), ("n2", 2), ("n3", 1)],
                                            preemption={"enabled": True, "min_runtime_s": 5.0}))
        for name, gpus, cls, at in (("S", 2, "batch", 3), ("V", 4, "batch", 10), ("P", 4, "research-training", 11)):
            store.append(t0 + at, [JobSubmitted(t0 + at, job(name, gpus, cls, "u", t0 + at))])
    finally:
        store.close()
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "reasons.py"), "--db", str(tmp_path)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    out = p.stdout + p.stderr
    assert "Traceback" not in out, out
    assert "reasons checked: 1   wrong: 0" in out and "NoPreemptibleVictims" in out, out
    assert p.returncode == 0, out


def test_big_cycle_bench_prints_every_figure_beside_its_goal():
    """``bench/bigcycle.py`` end to end on two tiny sizes: the cluster is full after the
    fill and every row is printed."""
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "bigcycle.py"), "--sizes", "40x300,80x600",
                        "--events", "10"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "Traceback" not in out, out
    for row in ("pass after a job end p99", "fair-share recalculation + pass", "peak memory MiB", "decisions digest"):
        assert row in out, out
    assert "320 / 0" in out and "640 / 0" in out, out  # GPUs / free after the fill: full

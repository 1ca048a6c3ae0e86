"""The daemon under faults and hostile clients (issue 19, design note 017): each test runs
a real `shepherd server` (tests/test_daemon.py's helper, SQLite in a tmp data directory)
and injects its fault for real - a killed runner or keeper, a database locked by another
process or on a full tmpfs, a slowloris client, hostile bodies. Named after the fault.

No timed assertions: every wait is a poll with a generous deadline.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path

import httpx
import pytest

from test_daemon import Server, gone, wait_for, wait_for_file

FAST_REQUEUE = ("--requeue-backoff", "0.2")


def _pids_code(pidfile: Path, flag: Path, run_marker: Path) -> str:
    """A job that records its process group (the runner's pid) and parent (the keeper),
    then waits for ``flag``; each run appends its number to ``run_marker``."""
    return (f"import os, time\nopen({str(run_marker)!r}, 'a').write(os.environ['SHEPHERD_RUN'] + '\\n')\n"
            f"open({str(pidfile)!r} + '.tmp', 'w').write(f'{{os.getpgrp()}} {{os.getppid()}} {{os.getpid()}}')\n"
            f"os.replace({str(pidfile)!r} + '.tmp', {str(pidfile)!r})\n"
            f"t0 = time.time()\nwhile not os.path.exists({str(flag)!r}) and time.time() - t0 < 120:\n"
            f"    time.sleep(0.05)\nprint('done')\n")


def _events(server: Server, kind: str, job_id: str) -> list[dict]:
    con = sqlite3.connect(server.data / "shepherd.db")
    try:
        rows = con.execute("SELECT t, payload FROM events WHERE kind = ? AND job_id = ? ORDER BY seq",
                           (kind, job_id)).fetchall()
    finally:
        con.close()
    return [dict(json.loads(p), t=t) for t, p in rows]


def _runs_on_disk(server: Server, job_id: str) -> list[str]:
    d = server.data / "runs" / job_id
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


@pytest.fixture
def srv(tmp_path):
    made: list[Server] = []

    def make(*extra: str) -> Server:
        s = Server(tmp_path)
        s.start(extra=extra)
        made.append(s)
        return s
    yield make
    for s in made:
        s.stop()


# -- 1: a lost run relaunched for ever ------------------------------------------------
def test_a_run_lost_while_the_server_runs_is_requeued_once_not_relaunched_for_ever(srv, tmp_path):
    """Before: the requeue's Stop(grace 0) armed a SIGKILL that killed the next run one
    step later, which was lost, requeued ... (1 -> 25 -> 49 runs in 20 s)."""
    pidfile, flag, marker = tmp_path / "pids", tmp_path / "flag", tmp_path / "runs"
    s = srv(*FAST_REQUEUE)
    job_id = s.submit(_pids_code(pidfile, flag, marker))
    s.wait_state(job_id, "RUNNING")
    pgid = int(wait_for("the job's pids", lambda: pidfile.exists() and pidfile.read_text()).split()[0])
    pidfile.unlink()
    os.killpg(pgid, signal.SIGKILL)  # runner, keeper and job: the run is lost
    second = int(wait_for("the second run", lambda: pidfile.exists() and pidfile.read_text()).split()[2])
    # a barrier, not a timer: once another job went through the loop, the SIGKILL that
    # used to hit the new run one step after its start has had its steps
    other = s.submit("print('barrier')")
    assert s.wait_state(other, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert not gone(second) and s.job(job_id)["runs"] == 2
    flag.touch()
    job = s.wait_state(job_id, "COMPLETED", "FAILED")
    assert job["state"] == "COMPLETED" and job["runs"] == 2 and job["lost_runs"] == 1
    assert marker.read_text().split() == ["1", "2"]
    assert [e["run"] for e in _events(s, "lost", job_id)] == [1]
    assert _runs_on_disk(s, job_id) == ["1", "2"]


def test_a_runner_that_cannot_start_is_requeued_with_back_off_then_failed_at_the_limit(srv, tmp_path):
    """An environment that breaks the runner itself (PYTHONHOME): 84 runs in 15 s before;
    now 1 + --max-requeues runs, each lost, then FAILED naming the requeue limit."""
    s = srv(*FAST_REQUEUE, "--max-requeues", "2")
    job_id = s.submit("print('never')", env={"PYTHONHOME": "/nonexistent"})
    job = s.wait_state(job_id, "FAILED", "COMPLETED")
    assert job["state"] == "FAILED" and job["runs"] == 3 and job["lost_runs"] == 3
    assert "requeue limit 2" in job["failure"] and "without an exit code" in job["failure"]
    lost = _events(s, "lost", job_id)
    assert [e["run"] for e in lost] == [1, 2, 3] and [e["final"] for e in lost] == [False, False, True]
    gaps = [b["t"] - a["t"] for a, b in zip(lost, lost[1:])]
    assert gaps[0] >= 0.2 and gaps[1] >= 0.4  # the back-off doubles: 0.2 s, then 0.4 s
    assert len(_events(s, "requeue", job_id)) == 2
    assert _runs_on_disk(s, job_id) == ["1", "2", "3"]
    assert s.free_gpus() == 4
    show = s.job(job_id)
    assert show["runs"] == 3  # and it stays so: a failed job is never launched again


# -- 8: a completed job ran again when its runner died while the server was down --------
def test_a_job_whose_runner_is_killed_while_the_server_is_down_is_not_run_again(srv, tmp_path):
    pidfile, flag, marker = tmp_path / "pids", tmp_path / "flag", tmp_path / "runs"
    s = srv()
    job_id = s.submit(_pids_code(pidfile, flag, marker))
    s.wait_state(job_id, "RUNNING")
    runner, keeper, job_pid = map(int, wait_for("the job's pids", lambda: pidfile.exists() and pidfile.read_text())
                                  .split())
    assert runner != keeper != job_pid
    s.kill9()
    os.kill(runner, signal.SIGKILL)  # the runner dies with the server ...
    flag.touch()  # ... and the job completes while nobody watches but its keeper
    wait_for("the job to end", lambda: gone(job_pid) and gone(keeper))
    s.start(policy=False)
    job = s.wait_state(job_id, "COMPLETED", "FAILED")
    assert job["state"] == "COMPLETED" and job["exit_code"] == 0 and job["runs"] == 1
    assert marker.read_text().split() == ["1"]  # ran once
    assert _events(s, "lost", job_id) == []


def test_a_killed_runner_or_keeper_leaves_the_run_running_and_its_exit_recorded(srv, tmp_path):
    s = srv()
    for victim in ("runner", "keeper"):
        d = tmp_path / victim
        d.mkdir()
        pidfile, flag, marker = d / "pids", d / "flag", d / "runs"
        job_id = s.submit(_pids_code(pidfile, flag, marker))
        s.wait_state(job_id, "RUNNING")
        runner, keeper, _job = map(int, wait_for("the job's pids", lambda: pidfile.exists() and pidfile.read_text())
                                   .split())
        os.kill(runner if victim == "runner" else keeper, signal.SIGKILL)
        wait_for(f"the {victim} to be gone", lambda: gone(runner if victim == "runner" else keeper))
        assert s.job(job_id)["state"] == "RUNNING", victim
        flag.touch()
        job = s.wait_state(job_id, "COMPLETED", "FAILED")
        assert (job["state"], job["exit_code"], job["runs"]) == ("COMPLETED", 0, 1), victim
        assert marker.read_text().split() == ["1"], victim


# -- 2 and 10: a failed commit dropped the step's exits; storage failures were bare 500s ----
def _hold_write_lock(db: Path):
    """Another process's write lock on the server's SQLite database (``BEGIN EXCLUSIVE``,
    held until ``commit()``): every write of the server waits its busy timeout, then
    fails with 'database is locked'."""
    con = sqlite3.connect(db, timeout=30, isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")
    return con


def test_exits_during_a_locked_database_are_kept_until_committed_and_the_api_answers_503(srv, tmp_path):
    flag = tmp_path / "flag"
    s = srv("--db-busy-timeout", "0.3")
    job_id = s.submit(wait_for_file(flag), gpus=2)
    victim = s.submit(wait_for_file(tmp_path / "never"), gpus=1)
    s.wait_state(job_id, "RUNNING")
    s.wait_state(victim, "RUNNING")
    jobs_before = len(httpx.get(s.url + "/jobs", timeout=60).json())
    lock = _hold_write_lock(s.data / "shepherd.db")
    try:
        flag.touch()  # the job exits; its exit file says 0; the commit that reports it fails
        wait_for("the step to fail on the lock", lambda: "storage unavailable: database is locked" in s.log.read_text())
        r = httpx.post(s.url + "/jobs", json={"class": "batch", "team": "ml", "command": ["true"],
                                              "cwd": str(tmp_path)}, timeout=120)
        assert r.status_code == 503 and r.headers["Retry-After"] == "5", r.text
        assert "database is locked" in r.json()["detail"] and "nothing was applied" in r.json()["detail"]
        r = httpx.post(f"{s.url}/jobs/{victim}/cancel", timeout=120)
        assert r.status_code == 503 and "nothing was applied" in r.json()["detail"], r.text
        assert s.job(job_id)["state"] == "RUNNING"  # reads still work (WAL), the exit is not applied yet
    finally:
        lock.commit()
        lock.close()
    job = s.wait_state(job_id, "COMPLETED", "FAILED")
    assert job["state"] == "COMPLETED" and job["exit_code"] == 0 and job["runs"] == 1
    assert s.job(victim)["state"] == "RUNNING"  # the cancel answered 503 was not applied
    assert len(httpx.get(s.url + "/jobs", timeout=60).json()) == jobs_before  # nor the submission
    assert wait_for("the job's GPUs free", lambda: s.free_gpus() == 3)
    text = s.log.read_text()
    assert "Traceback" not in text
    assert text.count("reconcile step failed") <= 2, text  # one line per kind a minute, not one per step
    httpx.post(f"{s.url}/jobs/{victim}/cancel", timeout=60)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 4 MiB tmpfs the test fills (root only; skipped, saying why, elsewhere)."""
    import subprocess

    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a full disk is made by mounting a small tmpfs, which needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(mnt: Path) -> Path:
    filler = mnt / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (65536, 4096, 1):  # until not one byte more fits
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass
    return filler


def test_exits_during_a_full_disk_are_kept_until_committed(tmp_path, small_tmpfs):
    flag = tmp_path / "flag"
    s = Server(tmp_path, db=f"sqlite:///{small_tmpfs / 'shepherd.db'}")
    s.start()
    try:
        job_id = s.submit(wait_for_file(flag), gpus=2)
        s.wait_state(job_id, "RUNNING")
        filler = _fill(small_tmpfs)
        flag.touch()
        wait_for("the step to fail on the full disk", lambda: "storage unavailable: disk full" in s.log.read_text())
        r = httpx.post(s.url + "/jobs", json={"class": "batch", "team": "ml", "command": ["true"],
                                              "cwd": str(tmp_path), "env": {"PAD": "x" * 60000}}, timeout=120)
        assert r.status_code == 503 and "disk full" in r.json()["detail"], r.text
        assert s.job(job_id)["state"] == "RUNNING"
        filler.unlink()
        job = s.wait_state(job_id, "COMPLETED", "FAILED")
        assert job["state"] == "COMPLETED" and job["exit_code"] == 0
        assert wait_for("all GPUs free", lambda: s.free_gpus() == 4)
        assert "Traceback" not in s.log.read_text()
    finally:
        s.stop()

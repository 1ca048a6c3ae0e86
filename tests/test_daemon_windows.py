"""Window closing enforced by the daemon on real processes (R8): a batch job running
in the night window is checkpointed and stopped when the day starts, then requeued,
and waits with the window's reason. The daemon's clock is shifted to a few seconds
before 08:00 (``Daemon(clock=...)``), so the test crosses the boundary at once."""

from __future__ import annotations

import datetime as dt
import sys
import time

import pytest

from gpushepherd.daemon.server import Daemon
from gpushepherd.model.job import JobSpec

POLICY = """\
name: windows-test
clock: {timezone: UTC}
cluster:
  nodes:
    - {name: local, gpus: 2, gpu_type: FAKE, gpu_mem_mib: 16384}
classes:
  batch:
    max_gpus: 0                      # by day: none
    windows:
      - {name: night, from: "20:00", to: "08:00", max_gpus: 2}
    on_window_close: checkpoint-and-stop
    grace_period_s: 3
    checkpointable: true
teams:
  ml: {}
"""

JOB = """\
import os, signal, sys, time
ckpt = os.path.join(os.environ['SHEPHERD_CHECKPOINT_DIR'], 'step')
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
print('run', os.environ['SHEPHERD_RUN'], 'from', open(ckpt).read() if os.path.exists(ckpt) else 0, flush=True)
t0 = time.time()
while not stop and time.time() - t0 < 120:
    time.sleep(0.05)
open(ckpt, 'w').write('saved')
print('checkpointed on SIGTERM', flush=True)
sys.exit(85)
"""


def wait_for(what, fn, timeout=45.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if v := fn():
            return v
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def test_the_day_window_checkpoints_and_stops_night_batch_then_requeues_it(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    boundary = dt.datetime(2026, 12, 1, 8, 0, tzinfo=dt.timezone.utc).timestamp()
    shift = boundary - 4.0 - time.time()  # the daemon's clock starts 4 s before 08:00 UTC
    daemon = Daemon(tmp_path / "data", policy_path=policy, poll_s=0.05, clock=lambda: time.time() + shift)
    daemon.start()
    try:
        job_id = daemon.submit(JobSpec(id="", team="ml", workload_class="batch", gpus=1, user="ana"),
                               [sys.executable, "-c", JOB], cwd=str(tmp_path))

        def state():
            with daemon.lock:
                return daemon.sched.jobs[job_id].state.value
        assert wait_for("the job to start in the night window", lambda: state() == "RUNNING")
        assert daemon.clock() < boundary
        wait_for("the window to close and the job to be requeued",
                 lambda: state() == "PENDING" and daemon.sched.jobs[job_id].runs == 1)
        assert daemon.clock() >= boundary
        with daemon.lock:
            view = daemon.job_view(job_id, history=True)
        stops = [h for h in view["history"] if h["to"] in ("STOPPING", "PREEMPTING")]
        assert stops and stops[0]["t"] >= boundary
        assert "window" in (stops[0]["reason"] or "").lower()
        assert "window" in view["reason"].lower() or "quota" in view["reason"].lower(), view["reason"]
        out = (tmp_path / "data" / "runs" / job_id / "1" / "stdout").read_text()
        assert "checkpointed on SIGTERM" in out  # it got SIGTERM and its grace, not a SIGKILL
        assert (tmp_path / "data" / "checkpoints" / job_id / "step").read_text() == "saved"
    finally:
        with daemon.lock:
            live = [j.id for j in daemon.sched.jobs.values() if not j.state.terminal]
        for j in live:
            daemon.cancel(j)
        daemon.stop()

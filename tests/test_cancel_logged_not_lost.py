"""A run this server killed (``shepherd cancel 5`` of a running job: the cancel's
SIGKILL takes its runner too) is logged as what it was, at INFO - not as a lost run
(a newcomer saw ``WARNING job 5: run 1 ended without an exit code: ... killed by
signal 9`` for an ordinary cancel)."""

from __future__ import annotations

import logging
import sys
import time

from builders import in_process_api

POLICY = """\
name: cancel-logged
cluster:
  nodes:
    - {name: local, gpus: 1, gpu_type: FAKE, gpu_mem_mib: 16384}
teams:
  ml: {}
"""


def _wait(what, pred, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not (v := pred()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return v


def test_a_cancelled_run_is_logged_at_info_as_a_cancel(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="gpushepherd")
    with in_process_api(tmp_path, POLICY) as client:
        d = client.daemon
        body = {"class": "batch", "team": "ml", "user": "ana", "gpus": 1,
                "command": [sys.executable, "-c", "import time; time.sleep(120)"], "cwd": str(tmp_path)}
        r = client.post("/jobs", json=body)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        _wait("the job to run", lambda: d.live_run.get(job_id) and d.backend.running(job_id))
        assert client.post(f"/jobs/{job_id}/cancel").status_code < 300
        _wait("the run to be reported ended", lambda: any(
            f"job {job_id}: run 1 ended by this server's SIGKILL" in r.getMessage() for r in caplog.records))
        assert client.get(f"/jobs/{job_id}").json()["state"] == "CANCELLED"
    mine = [r for r in caplog.records if f"job {job_id}" in r.getMessage()]
    assert not [r.getMessage() for r in mine if r.levelno >= logging.WARNING], [r.getMessage() for r in mine]
    [ended] = [r for r in mine if "SIGKILL" in r.getMessage()]
    assert ended.levelno == logging.INFO and "cancelled" in ended.getMessage(), ended.getMessage()
    assert not any("ended without an exit code" in r.getMessage() or "lost" in r.getMessage() for r in mine)

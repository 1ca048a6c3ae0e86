"""Cancelling one element of an array (``shepherd cancel 15_1``) is a cancel, not a
failure (a newcomer saw ``15_[0-3%2] F 3/4 done, 0 running, failed 1`` and ``state:
FAILED``, ``failed_indices: [1]``). The element reads CANCELLED, the others go on, the
array counts it apart (``cancelled_indices``, "cancelled 1") and, once every element
ended, takes its worst element's end: FAILED over CANCELLED over COMPLETED (Slurm:
``afterok`` on an array holds only when every task completed)."""

from __future__ import annotations

import sys
import time

from builders import in_process_api
from test_array_state_between_chunks import POLICY

from gpushepherd.daemon.arrays import ArrayRec, child_id, progress


def _rec(n: int, retries: int = 0) -> ArrayRec:
    rec = ArrayRec(id="15", num=15, text=f"0-{n - 1}%2", indices=list(range(n)), throttle=2, max_retries=retries,
                   submit_time=0.0, spec={}, argv=[], shell=False, env={}, cwd="/")
    rec.rebuild(lambda _j: None)
    return rec


def _both(rec: ArrayRec, states: dict[str, str]) -> dict:
    rec.update(states.get)
    inc, full = rec.counts(states.get), progress(rec, states)
    for key in ("state", "failed", "cancelled", "done"):
        assert inc[key] == full[key], key
    return inc


def _run_all(rec: ArrayRec, states: dict[str, str], ends: dict[int, str]) -> dict:
    for index in rec.indices:
        job_id = child_id(rec.id, index, 1)
        rec.submitted(index, job_id)
        states[job_id] = ends.get(index, "COMPLETED")
    return _both(rec, states)


def test_a_cancelled_element_is_counted_apart_and_is_no_failure():
    rec, states = _rec(4, retries=2), {}
    p = _run_all(rec, states, {1: "CANCELLED"})
    assert (p["state"], p["failed"], p["cancelled"], p["done"]) == ("CANCELLED", [], [1], 3)
    assert rec.retries == 0  # a cancelled element is not retried


def test_while_others_run_the_array_is_not_ended_by_a_cancelled_element():
    rec, states = _rec(4), {}
    rec.submitted(0, "15_0")
    rec.submitted(1, "15_1")
    states.update({"15_0": "RUNNING", "15_1": "CANCELLED"})
    p = _both(rec, states)
    assert p["state"] == "RUNNING" and p["cancelled"] == [1] and p["failed"] == []


def test_worst_end_wins_failed_over_cancelled_over_completed():
    assert _run_all(_rec(3), {}, {})["state"] == "COMPLETED"
    assert _run_all(_rec(3), {}, {0: "CANCELLED"})["state"] == "CANCELLED"
    p = _run_all(_rec(3), {}, {0: "CANCELLED", 2: "TIMEOUT"})
    assert (p["state"], p["failed"], p["cancelled"]) == ("FAILED", [2], [0])


def test_server_cancel_of_one_element(tmp_path):
    with in_process_api(tmp_path, POLICY) as client:
        d = client.daemon
        body = {"class": "batch", "team": "ml", "user": "ana", "gpus": 1, "array": "0-3%2",
                "command": [sys.executable, "-c",
                            "import os, time; time.sleep(60 if os.environ['SHEPHERD_ARRAY_TASK_ID'] == '1' else 0)"],
                "cwd": str(tmp_path)}
        r = client.post("/jobs", json=body)
        assert r.status_code == 201, r.text
        array_id = r.json()["id"]
        element = f"{array_id}_1"
        deadline = time.monotonic() + 60
        while getattr(d.sched.jobs.get(element), "state", None) is None or \
                d.sched.jobs[element].state.value != "RUNNING":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert client.post(f"/jobs/{element}/cancel").status_code < 300
        while (a := client.get(f"/jobs/{array_id}").json())["state"] in ("PENDING", "RUNNING"):
            assert time.monotonic() < deadline, a
            time.sleep(0.05)
        assert client.get(f"/jobs/{element}").json()["state"] == "CANCELLED"
        assert a["state"] == "CANCELLED" and a["failed_indices"] == [] and a["cancelled_indices"] == [1], a
        assert (a["done"], a["tasks"]) == (3, 4)
        assert "cancelled 1" in a["reason"] and "failed" not in a["reason"], a["reason"]
        # afterok on the array never holds (an element did not complete); afternotok does
        assert d.job_state(array_id) == "CANCELLED"

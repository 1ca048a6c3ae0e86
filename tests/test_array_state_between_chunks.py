"""An array's state between two chunks (a newcomer saw ``embed-batch: RUNNING ->
PENDING (4/6 done, 0 running)`` flash in ``shepherd demo``): the server submits the next
chunk one step after the last one ended, and the array read PENDING meanwhile - a
requeue that never happened. It reads RUNNING then; PENDING only when a submitted chunk
really waits (for GPUs, after a preemption), and no job's stored state changes."""

from __future__ import annotations

import sys
import time

from builders import in_process_api

from gpushepherd.daemon.arrays import ArrayRec, child_id, progress

POLICY = """\
name: array-between-chunks
cluster:
  nodes:
    - {name: local, gpus: 2, gpu_type: FAKE, gpu_mem_mib: 16384}
teams:
  ml: {}
"""


def _rec(n: int, retries: int = 0) -> ArrayRec:
    rec = ArrayRec(id="7", num=7, text=f"0-{n - 1}%1", indices=list(range(n)), throttle=1, max_retries=retries,
                   submit_time=0.0, spec={}, argv=[], shell=False, env={}, cwd="/")
    rec.rebuild(lambda _j: None)
    return rec


def _state(rec: ArrayRec, states: dict[str, str]) -> str:
    rec.update(states.get)
    inc, full = rec.counts(states.get)["state"], progress(rec, states)["state"]
    assert inc == full
    return inc


def _submit_next(rec: ArrayRec, states: dict[str, str]) -> str:
    [(index, attempt)] = rec.take(1)
    job_id = child_id(rec.id, index, attempt)
    states[job_id] = "PENDING"
    rec.submitted(index, job_id)
    return job_id


def test_between_chunks_the_array_stays_running_and_a_real_wait_is_pending():
    rec, states = _rec(3, retries=1), {}
    assert _state(rec, states) == "PENDING"  # nothing has run yet
    a = _submit_next(rec, states)
    assert _state(rec, states) == "PENDING"
    states[a] = "RUNNING"
    assert _state(rec, states) == "RUNNING"
    states[a] = "COMPLETED"  # the next chunk is submitted at the server's next step
    assert _state(rec, states) == "RUNNING"
    b = _submit_next(rec, states)
    assert _state(rec, states) == "PENDING"  # submitted, and the core has not started it: a real wait
    states[b] = "RUNNING"
    assert _state(rec, states) == "RUNNING"
    states[b] = "FAILED"  # retried at the next step
    assert _state(rec, states) == "RUNNING"
    b2 = _submit_next(rec, states)
    states[b2] = "RUNNING"
    assert _state(rec, states) == "RUNNING"
    states[b2] = "PENDING"  # preempted and requeued: the array's work really waits
    assert _state(rec, states) == "PENDING"
    states[b2] = "COMPLETED"
    c = _submit_next(rec, states)
    states[c] = "COMPLETED"
    assert _state(rec, states) == "COMPLETED"


def test_chunks_that_never_ran_leave_the_array_pending():
    rec, states = _rec(2), {}
    a = _submit_next(rec, states)
    states[a] = "CANCELLED"  # e.g. cancelled while pending: nothing of the array has run
    assert _state(rec, states) == "PENDING"


def test_server_array_never_reads_running_then_pending_without_a_requeue(tmp_path):
    with in_process_api(tmp_path, POLICY) as client:
        d = client.daemon
        seen: list[tuple[str, list[str]]] = []
        step = d.step

        def recording_step():  # the array's state and its chunks' core states after every step
            out = step()
            for rec in d.arrays.values():
                kids = sorted(j for j in d.sched.jobs if j.startswith(f"{rec.id}_"))
                seen.append((d._array_progress(rec)["state"], [d.sched.jobs[j].state.value for j in kids]))
            return out

        d.step = recording_step
        body = {"class": "batch", "team": "ml", "user": "ana", "gpus": 1, "array": "0-3%1",
                "command": [sys.executable, "-c", "pass"], "cwd": str(tmp_path)}
        r = client.post("/jobs", json=body)
        assert r.status_code == 201, r.text
        array_id = r.json()["id"]
        deadline = time.monotonic() + 60
        while client.get(f"/jobs/{array_id}").json()["state"] != "COMPLETED":
            assert time.monotonic() < deadline, seen[-5:]
            time.sleep(0.05)
        d.step = step
        shown = [s for i, (s, _k) in enumerate(seen) if i == 0 or seen[i - 1][0] != s]
        assert shown[-1] == "COMPLETED" and "RUNNING" in shown
        assert shown[shown.index("RUNNING"):] == ["RUNNING", "COMPLETED"], seen
        # every chunk ran once and completed: no requeue the array's states could stand for
        assert all(st == "COMPLETED" for st in seen[-1][1]) and len(seen[-1][1]) == 4

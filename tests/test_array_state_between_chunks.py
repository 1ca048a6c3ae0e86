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


def _state(rec: ArrayRec, states: dict[str, str], started: set[str] | None = None) -> str:
    ran = None if started is None else started.__contains__
    rec.update(states.get, ran)
    inc, full = rec.counts(states.get), progress(rec, states, ran)
    assert (inc["state"], inc["between"]) == (full["state"], full["between"])
    return inc["state"]


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


def test_a_chunk_cancelled_after_it_ran_has_run():
    # a chunk that started and was then cancelled ran: the array stays RUNNING until the next chunk
    # is submitted, on both counting paths (it flickered RUNNING -> PENDING -> RUNNING)
    rec, states, started = _rec(3), {}, set()
    a = _submit_next(rec, states)
    states[a] = "RUNNING"
    started.add(a)
    assert _state(rec, states, started) == "RUNNING"
    states[a] = "CANCELLED"
    assert _state(rec, states, started) == "RUNNING"
    rebuilt = _rec(3)  # a restart reads the same
    rebuilt.attempts = dict(rec.attempts)
    rebuilt.rebuild(states.get, started.__contains__)
    assert rebuilt.counts(states.get)["state"] == "RUNNING"
    b = _submit_next(rec, states)
    states[b] = "CANCELLED"  # cancelled before it started: still the first chunk's run
    assert _state(rec, states, started) == "RUNNING"


def _record_steps(d, record):
    """Call ``record(rec)`` for every array after each of the server's steps; the old step."""
    step = d.step

    def recording_step():
        out = step()
        for rec in d.arrays.values():
            record(rec)
        return out

    d.step = recording_step
    return step


def _submit_array(client, tmp_path, array: str, code: str) -> str:
    body = {"class": "batch", "team": "ml", "user": "ana", "gpus": 1, "array": array,
            "command": [sys.executable, "-c", code], "cwd": str(tmp_path)}
    r = client.post("/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_server_array_never_reads_running_then_pending_without_a_requeue(tmp_path):
    with in_process_api(tmp_path, POLICY) as client:
        d = client.daemon
        seen: list[tuple[str, list[str]]] = []
        reasons: list[str] = []

        def record(rec: ArrayRec) -> None:  # the array's state and its chunks' core states after every step
            kids = sorted(j for j in d.sched.jobs if j.startswith(f"{rec.id}_"))
            seen.append((d._array_progress(rec)["state"], [d.sched.jobs[j].state.value for j in kids]))
            view = d.array_view(rec)
            if view["state"] == "RUNNING" and not view["running"]:  # between chunks: no "0 running"
                reasons.append(view["reason"])

        step = _record_steps(d, record)
        array_id = _submit_array(client, tmp_path, "0-3%1", "pass")
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
        assert reasons and all(r.endswith(" done, next chunk being submitted") for r in reasons), reasons


def test_server_array_stays_running_when_a_chunk_that_ran_is_cancelled(tmp_path):
    with in_process_api(tmp_path, POLICY) as client:
        d = client.daemon
        seen: list[str] = []
        step = _record_steps(d, lambda rec: seen.append(d._array_progress(rec)["state"]))
        array_id = _submit_array(client, tmp_path, "0-1%1", "import time; time.sleep(60)")
        first, second = f"{array_id}_0", f"{array_id}_1"
        deadline = time.monotonic() + 60

        def wait(job_id: str, state: str) -> None:
            while getattr(d.sched.jobs.get(job_id), "state", None) is None or \
                    d.sched.jobs[job_id].state.value != state:
                assert time.monotonic() < deadline, (job_id, seen[-5:])
                time.sleep(0.05)

        wait(first, "RUNNING")
        assert client.post(f"/jobs/{first}/cancel").status_code < 300
        wait(second, "RUNNING")
        d.step = step
        assert d.job_started(first) and d.sched.jobs[first].state.value == "CANCELLED"
        shown = [s for i, s in enumerate(seen) if i == 0 or seen[i - 1] != s]
        assert shown[shown.index("RUNNING"):] == ["RUNNING"], seen
        client.post(f"/jobs/{array_id}/cancel")

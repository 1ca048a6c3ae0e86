"""Job arrays (R9, design note 008 "Job arrays") against a real `shepherd server`, on
SQLite and on a throwaway PostgreSQL (the helpers of tests/test_daemon.py).

No timed assertion: chunks wait for flag files; concurrency is observed through the
API while the test releases chunks one by one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_daemon import Server, wait_for

from gpushepherd.daemon.arrays import MAX_TASKS, child_id, parse_array, parse_child_id


def test_parse_array_slurm_syntax():
    assert parse_array("0-99%8") == (list(range(100)), 8)
    assert parse_array("1,3,5-7") == ([1, 3, 5, 6, 7], 5)
    assert parse_array("0-15:4%2") == ([0, 4, 8, 12], 2)
    assert parse_array("3,3,1") == ([1, 3], 2)
    assert len(parse_array(f"0-{MAX_TASKS - 1}")[0]) == MAX_TASKS
    for bad, why in [("", "no indexes"), ("%2", "no indexes"), ("5-3", "reversed"), (f"0-{MAX_TASKS}", "more than"),
                     ("0-9%0", "%0"), ("0-9%", "%"), ("a-b", "no index"), ("1,,2", "no index"), ("0-9:0", "step")]:
        with pytest.raises(ValueError, match=why):
            parse_array(bad)
    assert child_id("7", 3, 1) == "7_3" and child_id("7", 3, 2) == "7_3.2"
    assert parse_child_id("7_3.2") == ("7", 3, 2) and parse_child_id("7_3") == ("7", 3, 1)
    assert parse_child_id("12") is None


@pytest.fixture(params=["sqlite", "postgresql"])
def started(request, tmp_path):
    """A server of its own on SQLite, then on a fresh PostgreSQL database."""
    s = Server(tmp_path, db=request.getfixturevalue("pg_url") if request.param == "postgresql" else None).start()
    yield s
    s.stop()


def submit_array(s: Server, code: str, array: str, **extra) -> str:
    body = {"class": "batch", "team": "ml", "user": "ana", "gpus": 1, "command": [sys.executable, "-c", code],
            "cwd": str(s.data.parent), "array": array, **extra}
    r = httpx.post(s.url + "/jobs", json=body, timeout=60)
    assert r.status_code == 201, r.text
    assert r.json()["array"] == array
    return r.json()["id"]


def children(s: Server, array_id: str) -> list[dict]:
    jobs = httpx.get(s.url + "/jobs", params={"children": "true"}, timeout=60).json()
    return [j for j in jobs if j["id"].startswith(f"{array_id}_")]


def chunk_code(tmp: Path, wait: bool = False) -> str:
    """Appends its index to ``tmp/ran``, waits for ``tmp/go_<index>`` with ``wait``,
    prints its index."""
    code = (f"import os, time\ni = os.environ['SHEPHERD_ARRAY_TASK_ID']\n"
            f"open({str(tmp / 'ran')!r}, 'a').write(i + '\\n')\n")
    if wait:
        code += (f"t0 = time.time()\nwhile not os.path.exists(os.path.join({str(tmp)!r}, 'go_' + i)) "
                 f"and time.time() - t0 < 120:\n    time.sleep(0.05)\n")
    return code + "print('task', i, 'of', os.environ['SHEPHERD_ARRAY_ID'])"


def ran(tmp: Path) -> list[int]:
    return sorted(int(x) for x in (tmp / "ran").read_text().split())


def test_a_throttled_array_never_runs_more_than_n_and_completes(started, tmp_path):
    s = started
    array_id = submit_array(s, chunk_code(tmp_path, wait=True), "0-5%2")
    released, peak = set(), 0
    while len(released) < 6:
        kids = children(s, array_id)
        live = [k for k in kids if k["state"] in ("PENDING", "RUNNING")]
        assert len(live) <= 2, live  # at most %2 not yet ended, pending ones included
        peak = max(peak, sum(k["state"] == "RUNNING" for k in live))
        running = sorted((k for k in live if k["state"] == "RUNNING"), key=lambda k: int(k["id"].split("_")[1]))
        if running:
            index = running[0]["id"].split("_")[1]
            if index not in released:
                (tmp_path / f"go_{index}").write_text("")
                released.add(index)
    a = wait_for("the array to end", lambda: (j := s.job(array_id))["state"] in ("COMPLETED", "FAILED") and j)
    assert a["state"] == "COMPLETED" and (a["done"], a["tasks"]) == (6, 6)
    assert a["failed_indices"] == [] and a["retries_used"] == 0 and a["throttle"] == 2 and peak == 2
    assert a["children"] == {str(i): [f"{array_id}_{i}"] for i in range(6)}
    assert ran(tmp_path) == list(range(6))
    assert s.logs(f"{array_id}_4") == f"task 4 of {array_id}\n"
    # one line in the queue, the children only on request
    assert [j["id"] for j in httpx.get(s.url + "/jobs", timeout=60).json()] == [array_id]
    assert len(children(s, array_id)) == 6
    assert wait_for("all GPUs free", lambda: s.free_gpus() == 4)


def test_only_a_failed_chunk_is_retried(started, tmp_path):
    s = started
    # chunk 2 fails on its first attempt (no marker yet) and creates the marker
    code = chunk_code(tmp_path) + (
        f"\nimport sys\nm = os.path.join({str(tmp_path)!r}, 'marker_' + i)\n"
        f"if i == '2' and not os.path.exists(m):\n    open(m, 'w').close()\n    sys.exit(3)")
    array_id = submit_array(s, code, "0-4%3")
    a = wait_for("the array to end", lambda: (j := s.job(array_id))["state"] in ("COMPLETED", "FAILED") and j)
    assert a["state"] == "COMPLETED" and (a["done"], a["tasks"]) == (5, 5) and a["retries_used"] == 1
    assert a["children"]["2"] == [f"{array_id}_2", f"{array_id}_2.2"]
    assert all(a["children"][str(i)] == [f"{array_id}_{i}"] for i in (0, 1, 3, 4))
    assert ran(tmp_path) == [0, 1, 2, 2, 3, 4]  # the others ran exactly once
    assert s.job(f"{array_id}_2")["state"] == "FAILED" and s.job(f"{array_id}_2.2")["state"] == "COMPLETED"


def test_a_chunk_failing_every_time_fails_the_array_after_max_retries(started, tmp_path):
    s = started
    code = chunk_code(tmp_path) + "\nimport sys\nif i == '1':\n    sys.exit(1)"
    array_id = submit_array(s, code, "0-3%2", max_retries=1)
    a = wait_for("the array to end", lambda: (j := s.job(array_id))["state"] in ("COMPLETED", "FAILED") and j)
    assert a["state"] == "FAILED" and a["failed_indices"] == [1] and (a["done"], a["tasks"]) == (3, 4)
    assert a["retries_used"] == 1 and a["children"]["1"] == [f"{array_id}_1", f"{array_id}_1.2"]
    assert ran(tmp_path) == [0, 1, 1, 2, 3]
    assert "failed 1" in a["reason"]


def test_a_bad_array_is_422_naming_the_field(started, tmp_path):
    s = started
    body = {"class": "batch", "team": "ml", "user": "ana", "command": ["true"], "cwd": str(tmp_path)}
    for bad in ["", "5-3", f"0-{MAX_TASKS}", "0-9%0", "x"]:
        r = httpx.post(s.url + "/jobs", json={**body, "array": bad}, timeout=60)
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["detail"][0]["loc"] == ["body", "array"] and "is not allowed" in r.json()["detail"][0]["msg"]
    r = httpx.post(s.url + "/jobs", json={**body, "array": "0-3", "max_retries": -1}, timeout=60)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "max_retries"]
    r = httpx.post(s.url + "/jobs", json={**body, "array": "0-3", "class": "nope"}, timeout=60)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "class"]
    assert httpx.get(s.url + "/jobs", timeout=60).json() == []  # nothing accepted


def test_kill9_mid_array_resumes_and_runs_each_chunk_once(started, tmp_path):
    s = started
    array_id = submit_array(s, chunk_code(tmp_path, wait=True), "0-4%2")
    wait_for("two chunks running", lambda: sum(k["state"] == "RUNNING" for k in children(s, array_id)) == 2)
    (tmp_path / "go_0").write_text("")
    wait_for("chunk 0 done and chunk 2 running",
             lambda: {k["id"]: k["state"] for k in children(s, array_id)}.get(f"{array_id}_2") == "RUNNING")
    s.kill9()

    s.start(policy=False)
    a = s.job(array_id)
    assert a["done"] == 1 and a["running"] == 2 and a["runs"] == 3
    for i in range(1, 5):
        (tmp_path / f"go_{i}").write_text("")
    a = wait_for("the array to end", lambda: (j := s.job(array_id))["state"] in ("COMPLETED", "FAILED") and j)
    assert a["state"] == "COMPLETED" and (a["done"], a["tasks"]) == (5, 5) and a["retries_used"] == 0
    assert ran(tmp_path) == [0, 1, 2, 3, 4]  # every chunk ran once: none rerun, none lost
    assert all(s.job(f"{array_id}_{i}")["runs"] == 1 for i in range(5))


def test_array_client_commands_and_cancel(started, tmp_path):
    from typer.testing import CliRunner

    from gpushepherd.cli.main import app
    s = started

    def shepherd(*args):
        return CliRunner().invoke(app, [*args[:1], "--server", s.url, *args[1:]], catch_exceptions=False)

    res = shepherd("submit", "--class", "batch", "--team", "ml", "--array", "0-2%2", "--max-retries", "0",
                   "--chdir", str(tmp_path), "--", sys.executable, "-c", chunk_code(tmp_path))
    assert res.exit_code == 0 and res.output.startswith("Submitted array "), res.output
    array_id = res.output.split()[-1]
    wait_for("the array to end", lambda: s.job(array_id)["state"] == "COMPLETED")
    queue = shepherd("queue", "--all").output
    lines = [x for x in queue.splitlines() if x.strip().startswith(f"{array_id}_")]
    assert len(lines) == 1 and "3/3 done" in lines[0] and "COMPLETED" in lines[0]
    show = shepherd("show", array_id).output
    assert "progress: 3/3 done" in show and f"  1: {array_id}_1" in show
    assert shepherd("why", array_id).output.startswith(f"array {array_id} is COMPLETED: 3/3 done")
    res = shepherd("submit", "--class", "batch", "--team", "ml", "--array", "3-1", "--", "true")
    assert res.exit_code == 2 and "array: " in res.output and "reversed" in res.output

    # cancel: the live chunks are cancelled, no further chunk starts
    (tmp_path / "c").mkdir()
    array_id = submit_array(s, chunk_code(tmp_path / "c", wait=True), "0-9%2")
    wait_for("two chunks running", lambda: sum(k["state"] == "RUNNING" for k in children(s, array_id)) == 2)
    assert shepherd("cancel", array_id).output.strip() == f"job {array_id}: CANCELLED"
    a = s.job(array_id)
    assert a["state"] == "CANCELLED" and a["runs"] == 2 and a["done"] == 0
    assert all(k["state"] == "CANCELLED" for k in children(s, array_id))
    assert wait_for("all GPUs free", lambda: s.free_gpus() == 4)


@given(n=st.integers(1, 40), throttle=st.integers(1, 8), retries=st.integers(0, 2), seed=st.integers(0, 10**6))
@settings(max_examples=60, deadline=None)
def test_incremental_array_progress_equals_the_full_count(n, throttle, retries, seed):
    """Lazy expansion (issue 19, note 017) keeps an array's progress incrementally; at
    every step it must say what counting every chunk's last attempt says (``progress``)."""
    import random

    from gpushepherd.daemon.arrays import ArrayRec, progress

    rng = random.Random(seed)
    rec = ArrayRec(id="7", num=7, text="x", indices=sorted(rng.sample(range(1000), n)), throttle=throttle,
                   max_retries=retries, submit_time=0.0, spec={}, argv=[], shell=False, env={}, cwd="/")
    states: dict[str, str] = {}
    rec.rebuild(states.get)
    for _step in range(200):
        rec.update(states.get)
        live = rec.counts(states.get)["live"]
        for index, attempt in rec.take(max(0, rec.throttle - live)):
            job_id = child_id(rec.id, index, attempt)
            states[job_id] = "PENDING"
            rec.submitted(index, job_id)
        for job_id in list(rec.live):
            states[job_id] = rng.choice(["PENDING", "RUNNING", "COMPLETED", "FAILED", "FAILED", "TIMEOUT"])
        rec.update(states.get)
        inc, full = rec.counts(states.get), progress(rec, states)
        for key in ("state", "total", "done", "failed", "running", "pending", "submitted_pending", "retries_used"):
            assert inc[key] == full[key], (key, inc, full)
        again = ArrayRec(**{**rec.__dict__, "todo": None, "retry": [], "live": {}, "done": 0, "failed": [],
                            "retries": 0})
        again.rebuild(states.get)  # a restart rebuilds the same progress from attempts and states
        assert again.counts(states.get) == inc
        if inc["state"] in ("COMPLETED", "FAILED"):
            break
    assert rec.counts(states.get)["state"] in ("COMPLETED", "FAILED")

"""The submission path's shortcuts (note 032). A submission without a token to a server
without tokens: the API leaves the tokens' read to the loop step that takes it, one read
for the step's submissions; a token created meanwhile by another process or connection
on the same database still refuses it (401, nothing applied), as when the API read it
on arrival. A step's answers: one call on the event loop for all of them. In-process
server (``Daemon`` + ``make_app`` under Starlette's test client) on SQLite."""

from __future__ import annotations

import sys

import pytest
from builders import in_process_api
from test_regressions_api import POLICY  # one 8-GPU node, class batch, team research

from gpushepherd.daemon.server import Command, TokenRequired, answer_all
from gpushepherd.daemon.store import Store
from gpushepherd.model.job import JobSpec

ARGV = [sys.executable, "-c", "pass"]
SPEC = JobSpec(id="", team="research", workload_class="batch", gpus=1)


@pytest.fixture
def api(tmp_path):
    with in_process_api(tmp_path, POLICY) as client:
        yield client


def body(tmp_path, **kw) -> dict:
    return {"class": "batch", "team": "research", "command": ARGV, "cwd": str(tmp_path), **kw}


def other_connection_creates_a_token(d) -> str:
    """As ``shepherd token create`` does from another process: its own ``Store``."""
    other = Store(d.store.url)
    try:
        return other.create_token("ana", ["research"])[1]
    finally:
        other.close()


def test_a_token_less_submission_is_401_once_another_connection_created_a_token(api, tmp_path):
    d = api.daemon
    assert api.post("/jobs", json=body(tmp_path)).status_code == 201  # open: no token yet
    assert d.store.never_had_tokens_cached()  # so the next one goes to the loop unchecked
    token = other_connection_creates_a_token(d)
    jobs_before = d.store.job_ids()
    r = api.post("/jobs", json=body(tmp_path))
    assert r.status_code == 401 and r.json()["detail"].startswith("no token:")
    assert r.headers["www-authenticate"] == "Bearer"
    assert d.store.job_ids() == jobs_before  # nothing of it applied
    assert not d.store.never_had_tokens_cached()  # the step's read: later requests are checked on arrival
    assert api.post("/jobs", json=body(tmp_path)).status_code == 401
    r = api.post("/jobs", json=body(tmp_path, user="ana"), headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 201


def test_the_step_reads_the_tokens_once_for_all_its_unchecked_submissions(api, tmp_path, monkeypatch):
    d = api.daemon
    assert api.post("/jobs", json=body(tmp_path)).status_code == 201
    reads = []
    real = d.store.tokens_version
    monkeypatch.setattr(d.store, "tokens_version", lambda: reads.append(1) or real())
    with d.lock:  # all queued before the loop's next step takes them
        futs = [d.submit_future(SPEC, ARGV, cwd=str(tmp_path), open_check=True) for _ in range(5)]
        checked = d.submit_future(SPEC, ARGV, cwd=str(tmp_path))
    ids = [f.result(timeout=30)["id"] for f in futs + [checked]]
    assert len(set(ids)) == 6 and all(d.store.job_row(j) is not None for j in ids)
    assert len(reads) == 1


def test_a_token_created_while_submissions_wait_refuses_only_the_unchecked_ones(api, tmp_path):
    d = api.daemon
    assert api.post("/jobs", json=body(tmp_path)).status_code == 201
    with d.lock:  # queued before the token exists; the step takes them after
        unchecked = [d.submit_future(SPEC, ARGV, cwd=str(tmp_path), open_check=True) for _ in range(3)]
        checked = d.submit_future(SPEC, ARGV, cwd=str(tmp_path))  # e.g. the Unix socket's: checked on arrival
        other_connection_creates_a_token(d)
        before = d.next_num
    for fut in unchecked:
        with pytest.raises(TokenRequired):
            fut.result(timeout=30)
    assert checked.result(timeout=30)["id"] == str(before)
    assert d.next_num == before + 1  # the refused ones took no job number


class RecordingLoop:
    """An event loop's ``call_soon_threadsafe`` that runs the call at once and counts it."""

    def __init__(self):
        self.calls = 0

    def is_closed(self) -> bool:
        return False

    def call_soon_threadsafe(self, fn, *args):
        self.calls += 1
        fn(*args)


class Settled:
    """An asyncio future's two setters and ``done``, recording what was set."""

    def __init__(self, cancelled: bool = False):
        self.value, self.exc, self.cancelled = None, None, cancelled

    def done(self) -> bool:
        return self.cancelled or self.value is not None or self.exc is not None

    def set_result(self, value):
        self.value = value

    def set_exception(self, exc):
        self.exc = exc


def test_a_steps_answers_reach_each_event_loop_in_one_call():
    loops = [RecordingLoop(), RecordingLoop()]
    aios = [Settled(), Settled(), Settled(cancelled=True), Settled()]  # the third timed out (cancelled)
    cmds = [Command(aio=(loops[i // 3], a)) for i, a in enumerate(aios)] + [Command()]  # the last: no aio
    answer_all([(c, {"id": str(i)}) for i, c in enumerate(cmds)])
    assert [c.result(timeout=0) for c in cmds] == [{"id": str(i)} for i in range(5)]
    assert [a.value for a in aios] == [{"id": "0"}, {"id": "1"}, None, {"id": "3"}]
    assert [lp.calls for lp in loops] == [1, 1]
    refused = Command(aio=(loops[0], Settled()))
    refused.set_exception(TokenRequired("no token"))  # a refusal outside answer_all: its own call
    assert isinstance(refused.aio[1].exc, TokenRequired) and loops[0].calls == 2

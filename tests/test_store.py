"""The daemon's database: the event log round trip, replay determinism, the lock - on
SQLite and on PostgreSQL (a throwaway server, tests/pgserver.py; skipped where none)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from sqlalchemy import update

from gpushepherd.core.scheduler import Scheduler
from gpushepherd.daemon.store import LockHeld, Store, server_lock
from gpushepherd.model.events import JobCancelled, JobFinished, JobRequeueRequested, JobSubmitted, Tick
from gpushepherd.model.job import ExitStatus, GpuShare, JobSpec
from gpushepherd.policy.load import policy_from_dict

RAW = {"name": "t", "cluster": {"nodes": [{"name": "n", "gpus": 2, "gpu_type": "FAKE", "gpu_mem_mib": 16384}]},
       "teams": {"ml": {}}}


def spec(job_id: str, gpus: int = 1, **kw) -> JobSpec:
    return JobSpec(id=job_id, team="ml", workload_class="batch", gpus=gpus, **kw)


@pytest.fixture
def store(db_url):
    s = Store(db_url)
    yield s
    s.close()


def test_events_round_trip_through_the_log(store):
    batch = [JobSubmitted(10.0, spec("1", user="ana", gpu_types=("FAKE",), time_limit_s=60.0,
                                     share=GpuShare("fraction", milli=250, mem_mib=1024))),
             JobFinished(10.0, "7", ExitStatus.PREEMPTED), JobCancelled(10.0, "8"),
             JobRequeueRequested(10.0, "9"), Tick(10.0)]
    store.append_policy(1.0, RAW)
    assert store.append(10.0, batch) == 2
    epoch = 1764561234.123456  # a real clock's seconds keep their microseconds (a double, not a float4)
    assert store.append(epoch, [Tick(epoch)]) == 3
    assert list(Store(store.url).batches()) == [(1.0, "policy", RAW), (10.0, "events", batch),
                                                (epoch, "events", [Tick(epoch)])]
    assert Store(store.url).last_policy() == RAW


def test_replaying_the_log_gives_the_same_decisions(store):
    rules = policy_from_dict(RAW).rules
    live = Scheduler(rules)
    batches = [[JobSubmitted(1.0, spec("1", 2)), JobSubmitted(1.0, spec("2", 1))],
               [JobSubmitted(2.0, spec("3", 1))], [JobFinished(5.0, "1")], [JobCancelled(6.0, "3")],
               [JobFinished(7.0, "2", ExitStatus.PREEMPTED)], [Tick(8.0)]]
    decided = []
    for b in batches:
        store.append(b[0].t, b)
        decided.append(live.handle(b))
    replay = Scheduler(rules)
    again = [replay.handle(b) for _t, _kind, b in Store(store.url).batches()]
    assert again == decided and any(again)
    assert {j: x.state for j, x in replay.jobs.items()} == {j: x.state for j, x in live.jobs.items()}


def test_a_second_server_is_refused_and_a_dead_ones_lock_taken_over(store):
    store.acquire_lock(100.0)
    other = Store(store.url)
    with pytest.raises(LockHeld, match=r"another gpushepherd server holds it \(pid \d+ on host") as held:
        other.acquire_lock(110.0)
    # its start time names its zone, as every time the CLI prints (a bare local time read as UTC is off by hours)
    zone = time.strftime("%Z", time.localtime(100.0))
    assert f"since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(100.0))} {zone}," in str(held.value)
    # the holder died (kill -9) on this host: its pid is gone -> taken over at once
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with store.engine.begin() as c:
        c.execute(update(server_lock).values(pid=int(dead.stdout)))
    other.acquire_lock(111.0)
    assert not store.heartbeat(112.0) and other.heartbeat(112.0)
    # a holder on another host is taken over only when its heartbeat is stale
    with other.engine.begin() as c:
        c.execute(update(server_lock).values(host="elsewhere"))
    third = Store(store.url)
    with pytest.raises(LockHeld):
        third.acquire_lock(120.0)
    third.acquire_lock(150.0)
    assert not other.heartbeat(151.0)


def test_servers_starting_at_the_same_moment_one_wins(store):
    """Empty lock table (the insert race) and a dead holder (the compare-and-swap race)."""
    for round_ in ("empty", "dead holder"):
        others = [Store(store.url) for _ in range(4)]
        barrier, won, refused = threading.Barrier(len(others)), [], []

        def start(s: Store) -> None:
            barrier.wait()
            try:
                s.acquire_lock(200.0)
                won.append(s)
            except LockHeld:
                refused.append(s)

        threads = [threading.Thread(target=start, args=(s,)) for s in others]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(won) == 1 and len(refused) == len(others) - 1, round_
        assert won[0].heartbeat(201.0) and not any(s.heartbeat(201.0) for s in refused)
        if round_ == "empty":
            dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                                  text=True)
            with store.engine.begin() as c:
                c.execute(update(server_lock).values(pid=int(dead.stdout)))
        for s in others:
            s.close()


def test_sqlite_runs_in_wal_mode_with_full_sync(tmp_path):
    store = Store(Store.sqlite_url(tmp_path))
    with store.engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert c.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
    with store._lazy.connect() as c:  # the jobs table's own writes: a crash of the server, not a power cut
        assert c.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL


def test_update_jobs_sets_each_rows_columns_and_leaves_the_others(store):
    rows = [dict(id=str(i), num=i, spec="{}", argv="[]", shell=False, env="{}", cwd="/", state="PENDING", run=0)
            for i in (1, 2, 3)]
    store.append(1.0, [], rows)
    store.update_jobs({"1": {"state": "RUNNING", "run": 1, "pid": None},
                       "2": {"state": "COMPLETED", "exit_code": 0},
                       "3": {"state": "RUNNING", "run": 1, "pid": None}})
    store.update_jobs({"1": {"pid": 41}, "3": {"pid": 43, "exit_code": None}})
    again = Store(store.url).job_rows()  # read back through a connection of its own
    assert [(r["state"], r["run"], r["pid"], r["exit_code"]) for r in again.values()] == [
        ("RUNNING", 1, 41, None), ("COMPLETED", 0, None, 0), ("RUNNING", 1, 43, None)]
    store.update_jobs({})  # nothing to write: no transaction, no error


def test_the_token_cache_sees_tokens_created_and_revoked_by_another_store_at_once(store):
    # another Store on the same database: what `shepherd token create/revoke` does from its own process
    other = Store(store.url)
    try:
        assert store.active_tokens_cached() == [] and store.tokens_version() is None
        token_id, token = other.create_token("ana", ["ml"])
        v1 = store.tokens_version()
        assert v1 is not None
        assert [t[0] for t in store.active_tokens_cached()] == [token_id]
        assert store.authenticate(token, store.active_tokens_cached()).user == "ana"
        assert other.revoke_token(token_id)
        assert store.tokens_version() not in (None, v1)
        assert store.active_tokens_cached() == []
        assert not other.revoke_token(token_id)  # nothing changed: the version stays
        v2 = store.tokens_version()
        assert not other.revoke_token(token_id) and store.tokens_version() == v2
        second, _ = other.create_token("bo", ["ml"], admin=True)
        assert [t[0] for t in store.active_tokens_cached()] == [second]
    finally:
        other.close()


def test_the_token_cache_reads_the_tokens_again_only_after_a_change(store, monkeypatch):
    reads = []
    real = store.active_tokens
    monkeypatch.setattr(store, "active_tokens", lambda: reads.append(1) or real())
    store.create_token("ana", ["ml"])
    for _ in range(5):
        assert len(store.active_tokens_cached()) == 1
    assert len(reads) == 1
    store.create_token("bo", ["ml"])
    assert len(store.active_tokens_cached()) == 2 and len(reads) == 2


def test_an_engine_runs_60_bit_id_and_its_uid_are_stored_whole(store):
    # Ray and Kubernetes runs are recorded by the first 15 hex digits of their actor id or
    # pod uid and by that id: PostgreSQL's 32-bit INTEGER and VARCHAR(32) refused them and
    # the launch was never committed
    store.append(1.0, [], [dict(id="1", num=1, spec="{}", argv="[]", shell=False, env="{}", cwd="/",
                                state="PENDING", run=0)])
    big = int("f" * 15, 16)
    uid = "0f3b2a9e-58c1-4d7e-9a41-3c2b1d0e9f87"  # a pod's
    store.update_jobs({"1": {"state": "RUNNING", "run": 1, "pid": big, "pgid": big, "proc_start": uid}})
    row = Store(store.url).job_rows()["1"]
    assert (row["pid"], row["pgid"], row["proc_start"]) == (big, big, uid)

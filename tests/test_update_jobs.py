"""Changing a job after submit (issue 13 point 7, design note 039): time limit and nice of
pending and running jobs through a real server (``test_dependencies.Api``: an in-process
``Daemon`` + ``make_app``, SQLite, real processes that wait for flag files), the
permission rule (user vs admin), bad input naming the field, the event and audit logs,
and a restart that replays it all; the core rule itself on a ``Scheduler``."""

from __future__ import annotations

import json

import pytest
from builders import route_cli_to
from test_daemon import wait_for
from test_dependencies import Api, api, waits  # noqa: F401 - api: the fixture of one server

from gpushepherd.core.scheduler import Scheduler, SpecError
from gpushepherd.daemon.store import event_from_row, event_row
from gpushepherd.model.events import JobFinished, JobRequeueRequested, JobSubmitted, JobUpdated
from gpushepherd.model.job import JobSpec
from gpushepherd.policy.load import policy_from_dict


def loc(r) -> str:
    return r.json()["detail"][0]["loc"][-1]


def msg(r) -> str:
    return json.dumps(r.json()["detail"])


# ---------------------------------------------------------------- the core rule
RAW = {"cluster": {"nodes": [{"name": "n1", "gpus": 4, "gpu_type": "H100-80GB", "gpu_mem_mib": 81920}]},
       "classes": {"batch": {"max_runtime_s": 1000}}, "preemption": {"enabled": False}}


def _core(reference: bool = False) -> Scheduler:
    s = Scheduler(policy_from_dict(RAW).rules, reference=reference)
    s.handle([JobSubmitted(0, JobSpec("X", "T", "batch", 4, time_limit_s=100))])
    s.handle([JobSubmitted(1, JobSpec("H", "T", "batch", 4, time_limit_s=50, submit_time=1))])
    return s


@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
def test_a_running_jobs_lower_limit_moves_its_end_and_the_reservation_and_a_raise_moves_them_back(reference):
    s = _core(reference)
    assert s.jobs["X"].state.value == "RUNNING" and s.estimated_start("H") == 100
    assert s.handle([JobUpdated(10, "X", time_limit_s=40, admin=False)]) == []
    assert s.estimated_start("H") == 40 and s.next_wakeup() == 40 and s.ends_sorted()[0][0] == 40
    assert s.handle([JobUpdated(20, "X", time_limit_s=90)]) == []  # an admin raises it again
    assert s.estimated_start("H") == 90 and s.next_wakeup() == 90
    assert s.handle([JobUpdated(40, "X", nice=0)]) == []  # the stale timer at 40 stops nothing
    out = s.handle([JobUpdated(60, "X", time_limit_s=30)])  # below the 60 s it has run: stopped at once
    assert [(d.job_id, d.reason) for d in out] == [("X", "time-limit")]
    assert [h.reason for h in s.jobs["X"].history if h.reason.startswith("updated")] == [
        "updated: time limit 100 s -> 40 s", "updated: time limit 40 s -> 90 s (admin)", "updated: nice 0 -> 0 (admin)",
        "updated: time limit 90 s -> 30 s (admin)"]
    assert [d.job_id for d in s.handle([JobFinished(60, "X")])] == ["H"]


def test_a_nudge_reorders_pending_jobs_and_shows_as_the_nice_factor():
    s = _core()
    s.handle([JobSubmitted(1, JobSpec("L", "T", "batch", 4, time_limit_s=10, submit_time=1))])  # after H by id
    assert [j.id for j in s.pending_jobs()] == ["H", "L"]
    s.handle([JobUpdated(2, "L", nice=-1000)])  # an admin's nudge
    assert [j.id for j in s.pending_jobs()] == ["L", "H"]
    f = s.priority_factors("L")
    assert f["nice"] == -1000 and f["priority"] == s.priority_factors("H")["priority"] + 1000
    s.handle([JobUpdated(3, "L", nice=5, admin=False)])  # its user may raise it (lower the priority)
    assert [j.id for j in s.pending_jobs()] == ["H", "L"]
    snap = json.loads(json.dumps(s.snapshot()))
    r = Scheduler.restore(s.rules, snap)
    assert [j.id for j in r.pending_jobs()] == ["H", "L"] and r.jobs["L"].spec.nice == 5


@pytest.mark.parametrize("event, needle", [
    (JobUpdated(1, "X", time_limit_s=2000), "time_limit_s: 2000 is not allowed: at most the max runtime of class"),
    (JobUpdated(1, "X", time_limit_s=150, admin=False), "time_limit_s: 150 is not allowed: at most the job's "
                                                        "time limit now (100 s): only an admin may raise it"),
    (JobUpdated(1, "H", nice=-1, admin=False), "nice: -1 is not allowed: at least the job's nice now (0): only an "
                                               "admin may lower it"),
    (JobUpdated(1, "H", nice=2**40), "nice: 1099511627776 is not allowed: an integer from"),
    (JobUpdated(1, "H", time_limit_s=0), "time_limit_s: 0 is not allowed: seconds > 0"),
    (JobUpdated(1, "H"), "nothing to change"),
])
def test_an_update_that_breaks_a_rule_is_refused_naming_the_field_and_nothing_is_applied(event, needle):
    s = _core()
    before = json.dumps(s.snapshot())
    with pytest.raises(SpecError) as exc:
        s.handle([event])
    assert needle in str(exc.value)
    assert json.dumps(s.snapshot()) == before


def test_a_pending_job_whose_banked_work_reaches_its_new_limit_ends_timeout():
    """Found by the oracle (seed 3231): a requeued checkpointing job keeps its banked work;
    a limit below it leaves no run to make (as ``Book.requeue``)."""
    s = Scheduler(policy_from_dict(RAW).rules)
    s.handle([JobSubmitted(0, JobSpec("X", "T", "batch", 4, time_limit_s=100, checkpointable=True))])
    s.handle([JobSubmitted(1, JobSpec("H", "T", "batch", 4, time_limit_s=50, submit_time=1))])
    out = s.handle([JobRequeueRequested(30, "X"), JobUpdated(30, "H", nice=-10)])  # H goes first
    assert [(type(d).__name__, d.job_id) for d in out] == [("Stop", "X"), ("Start", "H")]
    x = s.jobs["X"]
    assert x.state.value == "PENDING" and x.done_s == 30
    assert s.handle([JobUpdated(31, "X", time_limit_s=20)]) == []
    assert x.state.value == "TIMEOUT" and x.history[-1].reason == "no time left of its time limit"
    assert "X" not in [j.id for j in s.pending_jobs()]
    s.check_invariants()


def test_an_update_of_an_ended_job_is_a_no_op_and_the_event_log_row_round_trips():
    s = _core()
    s.handle([JobFinished(5, "X")])
    assert s.handle([JobUpdated(6, "X", time_limit_s=10, nice=3)]) == []
    assert s.jobs["X"].spec.nice == 0 and s.jobs["X"].time_limit_s == 100
    e = JobUpdated(7.5, "H", time_limit_s=20.0, nice=-3, admin=False)
    row = event_row(e)
    assert row["kind"] == "update" and event_from_row(7.5, row["kind"], row["job_id"], row["payload"]) == e


# ------------------------------------------------------------ through a server
def test_a_running_jobs_limit_lowered_below_what_it_ran_stops_it_as_its_time_limit(api, tmp_path):
    j = api.submit(waits(tmp_path / "flag"), time_limit_s=3600)["id"]
    api.state(j, "RUNNING")
    r = api.client.patch(f"/jobs/{j}", json={"time_limit_s": 0.001})
    assert r.status_code == 200, r.text
    done = api.state(j, "TIMEOUT", "COMPLETED", "FAILED")
    assert done["state"] == "TIMEOUT" and done["time_limit_s"] == 0.001
    reasons = [h["reason"] for h in done["history"]]
    assert "updated: time limit 3600 s -> 0.001 s (admin)" in reasons and "time limit reached" in reasons
    audit = api.client.get("/audit", params={"action": "update"}).json()
    assert audit[-1]["target"] == j and audit[-1]["outcome"] == "ok"
    assert audit[-1]["detail"]["changes"] == {"time_limit_s": 0.001}
    r = api.client.patch(f"/jobs/{j}", json={"time_limit_s": 60})  # it ended
    assert r.status_code == 409 and "TIMEOUT" in r.json()["detail"] and "time_limit_s and nice" in r.json()["detail"]


def test_an_admins_nudge_starts_the_later_job_first_and_why_shows_it(api, tmp_path, monkeypatch):
    flag, flag2 = tmp_path / "flag", tmp_path / "flag2"
    big = api.submit(waits(flag), gpus=2)["id"]
    api.state(big, "RUNNING")
    a = api.submit(waits(flag2), gpus=2)["id"]
    b = api.submit(waits(flag2), gpus=2)["id"]
    cli = route_cli_to(api.client, monkeypatch)
    code, out, err = cli("update", b, "--nice", "-1000")
    assert code == 0, err
    v = api.job(b)
    assert v["nice"] == -1000 and v["priority_factors"]["nice"] == -1000
    assert v["priority"] == api.job(a)["priority"] + 1000
    code, out, err = cli("why", b)
    assert code == 0 and "- nice -1000" in out, out
    code, out, err = cli("show", b)
    assert code == 0 and "nice: -1000" in out and "time_limit_s: 86400" in out, out
    r = api.client.patch(f"/jobs/{a}", json={"name": "x"})  # name only while the server keeps it
    assert r.status_code == 409 and "name cannot be changed now" in r.json()["detail"]
    flag.touch()
    api.state(b, "RUNNING")
    assert api.job(a)["state"] == "PENDING"
    flag2.touch()
    assert api.state(a, "COMPLETED")["state"] == "COMPLETED"


def test_a_user_may_lower_a_limit_and_raise_a_nice_an_admin_also_the_reverse(tmp_path):
    a = Api(tmp_path, tokens=True)
    try:
        j = a.submit(waits(tmp_path / "flag"), user="ana", time_limit_s=3600)["id"]
        a.state(j, "RUNNING")

        def patch(user, **body):
            return a.client.patch(f"/jobs/{j}", json=body, headers=a.h(user))

        assert patch("ana", time_limit_s=1800).status_code == 200
        r = patch("ana", time_limit_s=3600)
        assert r.status_code == 422 and loc(r) == "time_limit_s" and "only an admin may raise it" in msg(r)
        r = patch("ana", nice=-5)
        assert r.status_code == 422 and loc(r) == "nice" and "only an admin may lower it" in msg(r)
        assert patch("bo", time_limit_s=60).status_code == 403  # not bo's job
        assert patch("ana", nice=5).status_code == 200
        assert patch("root", time_limit_s=7200, nice=-5).status_code == 200
        r = patch("root", time_limit_s=90000)
        assert r.status_code == 422 and loc(r) == "time_limit_s" and "max runtime of class batch" in msg(r)
        r = patch("root", nice=1.5)
        assert r.status_code == 422 and loc(r) == "nice"
        v = a.job(j)
        assert v["state"] == "RUNNING" and v["time_limit_s"] == 7200 and v["nice"] == -5  # nothing half-applied
        outcomes = [(e["user"], e["outcome"]) for e in
                    a.client.get("/audit", params={"action": "update"}, headers=a.h("root")).json()]
        assert outcomes[:3] == [("ana", "ok"), ("ana", "refused"), ("ana", "refused")]
    finally:
        (tmp_path / "flag").touch()
        a.close()


@pytest.mark.parametrize("snapshot", [True, False], ids=["stop", "crash"])
def test_a_restart_replays_the_limits_and_nudges(tmp_path, snapshot):
    flag = tmp_path / "flag"
    a = Api(tmp_path)
    try:
        run = a.submit(waits(flag), gpus=2, time_limit_s=3600)["id"]
        a.state(run, "RUNNING")
        p1 = a.submit(gpus=2)["id"]
        p2 = a.submit(gpus=2)["id"]
        assert a.client.patch(f"/jobs/{run}", json={"time_limit_s": 1800}).status_code == 200
        assert a.client.patch(f"/jobs/{p2}", json={"nice": -7, "time_limit_s": 600}).status_code == 200
        before = {j: (a.job(j)["time_limit_s"], a.job(j)["nice"], a.job(j)["priority"]) for j in (run, p1, p2)}
        a.restart(snapshot)
        after = {j: (a.job(j)["time_limit_s"], a.job(j)["nice"], a.job(j)["priority"]) for j in (run, p1, p2)}
        assert after == before and after[run][0] == 1800 and after[p2][:2] == (600, -7)
        core = a.d.sched.jobs[run]
        assert core.time_limit_s == 1800 and a.d.sched.next_wakeup() <= core.run_start + 1800
        flag.touch()
        wait_for("p2 before p1", lambda: a.job(p2)["first_start"] is not None)
        assert a.job(p1)["first_start"] is None or a.job(p1)["first_start"] >= a.job(p2)["first_start"]
    finally:
        flag.touch()
        a.close()


def test_whatif_replays_the_logs_updates_on_the_specs_as_submitted():
    """The what-if baseline (note 010) sees a nudge and a limit change where the log had
    them: B, nudged ahead of A at 5, starts first as it did; X keeps its lowered limit."""
    from gpushepherd.report.history import replay
    from gpushepherd.report.whatif import run_whatif
    from gpushepherd.model.job import ExitStatus

    def sub(t, job_id, limit):
        return JobSubmitted(t, JobSpec(job_id, "T", "batch", 4, time_limit_s=limit, submit_time=t))

    log = [(0.0, "policy", RAW), (0.0, "events", [sub(0.0, "X", 100)]),
           (1.0, "events", [sub(1.0, "A", 10)]), (2.0, "events", [sub(2.0, "B", 10)]),
           (5.0, "events", [JobUpdated(5.0, "B", nice=-10), JobUpdated(5.0, "X", time_limit_s=60, admin=False)]),
           (50.0, "events", [JobFinished(50.0, "X", ExitStatus.COMPLETED)]),
           (60.0, "events", [JobFinished(60.0, "B", ExitStatus.COMPLETED)]),
           (70.0, "events", [JobFinished(70.0, "A", ExitStatus.COMPLETED)])]
    rp = replay(log)
    assert rp.recorder.specs["X"].time_limit_s == 100 and rp.recorder.specs["B"].nice == 0  # as submitted
    wi = run_whatif(rp, rp.rules, 0.0, 100.0)
    for res in (wi.current, wi.proposed):
        assert {j: r.starts[0][0] for j, r in res.records.items()} == {"X": 0.0, "B": 50.0, "A": 60.0}
        assert res.scheduler.jobs["X"].time_limit_s == 60 and res.scheduler.jobs["B"].spec.nice == -10


def test_a_second_update_of_a_job_in_one_loop_step_is_refused_not_judged_on_a_stale_state(api, tmp_path):
    from gpushepherd.daemon.server import JobActionRefused

    j = api.submit(waits(tmp_path / "flag"), time_limit_s=3600)["id"]
    api.state(j, "RUNNING")
    batch: list = []
    with api.d.lock:
        api.d._job_action(api.d.sched.now, "update", j, {"time_limit_s": 1800}, False, batch, [])
        with pytest.raises(JobActionRefused, match="another update in this step"):
            api.d._job_action(api.d.sched.now, "update", j, {"time_limit_s": 3600}, False, batch, [])
    assert [(type(e).__name__, e.time_limit_s) for e in batch] == [("JobUpdated", 1800)]

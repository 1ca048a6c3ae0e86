"""A job in its preemption grace period says for whom it is stopped (fixes, point 3):
``Preempted(by job P, class C)`` - with ``reclaim`` when its cohort's lender takes its
quota back, ``Preempted(window closed: LIMIT)`` when a window closes on it - in the
core's ``state_reason``, the API's ``reason``, ``shepherd why`` and ``shepherd show``."""

from __future__ import annotations

import json
import sys
import time

from builders import in_process_api, job, policy, policy_dict, route_cli_to, scheduler, submit
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Preempt
from gpushepherd.model.events import JobFinished, Tick
from gpushepherd.model.job import ExitStatus, JobState
from gpushepherd.policy import policy_from_dict


def test_a_class_preemption_victim_names_its_preemptor_and_class_through_a_restart():
    rules = policy(nodes=[("n1", 2)], classes={"batch": {"grace_period_s": 30}})
    sched, _ = scheduler(rules, job("v", 2))
    out = sched.handle(submit(job("p", 2, cls="production-inference", submit=10)))
    assert out == [Preempt(10, "v", grace_s=30.0, reason="priority:production-inference", preemptor="p")]
    assert sched.state_reason("v") == "Preempted(by job p, class production-inference)"
    assert sched.state_reason("p") == "PreemptionInProgress(v)"  # the preemptor's side, unchanged
    again = Scheduler.restore(rules, json.loads(json.dumps(sched.snapshot())))
    assert again.state_reason("v") == "Preempted(by job p, class production-inference)"
    sched.handle([JobFinished(20, "v", ExitStatus.PREEMPTED)])
    assert sched.jobs["v"].state is JobState.PENDING
    assert not sched.state_reason("v").startswith("Preempted")  # pending: the admission rule's reason
    assert sched.state_reason("p") is None  # running, not being preempted


def test_a_reclaimed_borrower_says_reclaim():
    raw = policy_dict(nodes=[("n1", 2)], teams={"A": {"nominal_gpus": 2}, "B": {"nominal_gpus": 0}},
                      cohorts={"c": {"members": ["A", "B"], "reclaim": "any"}},
                      classes={"training": {"grace_period_s": 30}})
    rules = policy_from_dict(raw).rules
    sched, _ = scheduler(rules, job("b1", 2, team="B", cls="training", preemptible=True, checkpointable=True))
    out = sched.handle(submit(job("a1", 2, team="A", cls="training", submit=10)))
    assert [(d.job_id, d.reason, d.preemptor) for d in out] == [("b1", "reclaim", "a1")]
    assert sched.state_reason("b1") == "Preempted(by job a1, class training, reclaim)"


def test_a_job_a_window_closes_on_says_which_limit():
    raw = policy_dict(nodes=[("n1", 2)], preemption=False,
                      teams={"T": {"max_gpus": 0, "windows": [{"name": "night", "from": "00:00", "to": "01:00",
                                                              "max_gpus": 2}]}},
                      classes={"batch": {"on_window_close": "checkpoint-and-stop", "grace_period_s": 60}})
    raw["clock"] = {"timezone": "UTC", "start": "2026-11-30T00:00:00"}
    rules = policy_from_dict(raw).rules
    sched, _ = scheduler(rules, job("n", 2, team="T", cls="batch", checkpointable=True, runtime_estimate_s=None))
    out = sched.handle([Tick(3600.0)])
    assert [(d.job_id, type(d).__name__) for d in out] == [("n", "Preempt")]
    assert sched.state_reason("n") == f"Preempted(window closed: {out[0].reason.removeprefix('window-closed:')})"
    assert "teams.T" in sched.state_reason("n")


POLICY = """\
name: preempted-reason
cluster:
  nodes:
    - {name: local, gpus: 1, gpu_type: FAKE, gpu_mem_mib: 16384}
classes:
  batch: {grace_period_s: 600}
teams:
  ml: {}
preemption: {enabled: true}
"""


def test_why_show_and_the_api_name_the_preemptor_of_a_job_in_its_grace_period(tmp_path, monkeypatch):
    # the victim ignores SIGTERM: it stays in its grace period (600 s) while we look
    flag = tmp_path / "ignoring"
    victim_code = (f"import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                   f"open({str(flag)!r}, 'w').close()\ntime.sleep(300)")
    with in_process_api(tmp_path, POLICY) as client:
        cli = route_cli_to(client, monkeypatch)

        def post(code, cls):
            r = client.post("/jobs", json={"class": cls, "team": "ml", "user": "ana", "gpus": 1,
                                           "command": [sys.executable, "-c", code], "cwd": str(tmp_path)})
            assert r.status_code == 201, r.text
            return r.json()["id"]
        victim = post(victim_code, "batch")
        end = time.monotonic() + 45
        while not flag.exists() and time.monotonic() < end:  # its code runs, SIGTERM ignored
            time.sleep(0.05)
        urgent = post("print('serving')", "production-inference")
        while client.get(f"/jobs/{victim}").json()["state"] != "PREEMPTING" and time.monotonic() < end:
            time.sleep(0.05)
        want = f"Preempted(by job {urgent}, class production-inference)"
        try:
            view = client.get(f"/jobs/{victim}").json()
            assert view["state"] == "PREEMPTING" and view["reason"] == want, view
            code, out, _err = cli("why", victim)
            assert code == 0 and out.strip() == f"job {victim} is PREEMPTING on local:0: {want}", out
            code, out, _err = cli("show", victim)
            assert code == 0 and f"reason: {want}" in out.splitlines(), out
            listed = {j["id"]: j for j in client.get("/jobs").json()}
            assert listed[victim]["reason"] == want
            assert client.get(f"/jobs/{urgent}").json()["reason"] == f"PreemptionInProgress({victim})"
        finally:
            client.post(f"/jobs/{victim}/cancel")
            client.post(f"/jobs/{urgent}/cancel")

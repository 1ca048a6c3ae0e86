"""Deadlines: a job that cannot end by its deadline is flagged at submit and at start."""

import pytest
from builders import job, policy_dict

from gpushepherd.core.scheduler import SpecError, validate_spec
from gpushepherd.policy import policy_from_dict
from gpushepherd.sim.engine import Restart, SimJob, Simulator

RULES = policy_from_dict(policy_dict(nodes=[("n1", 1)], preemption=False)).rules


def test_flagged_at_submit_when_even_starting_now_is_too_late():
    jobs = [SimJob(job("late", 1, submit=0, time_limit_s=7200, deadline=3600), 100)]
    res = Simulator(RULES, jobs).run()
    flags = res.scheduler.deadline_at_risk("late")
    assert [(t, stage) for t, stage, _ in flags] == [(0.0, "submit"), (0.0, "start")]
    assert flags[0][2] == 7200
    assert any("deadline at risk (submit)" in h.reason for h in res.scheduler.jobs["late"].history)


def test_flagged_at_start_after_waiting_too_long_but_not_at_submit():
    jobs = [SimJob(job("hog", 1, submit=0, runtime_estimate_s=5000), 5000),
            SimJob(job("nightly", 1, submit=10, runtime_estimate_s=1000, deadline=4000), 1000),
            SimJob(job("fine", 1, submit=20, runtime_estimate_s=10, deadline=10**6), 10)]
    res = Simulator(RULES, jobs).run()
    assert [stage for _, stage, _ in res.scheduler.deadline_at_risk("nightly")] == ["start"]
    assert res.scheduler.deadline_at_risk("nightly")[0][:1] == (5000.0,)
    assert res.scheduler.deadline_at_risk("fine") == []


def test_flags_survive_a_restart():
    jobs = [SimJob(job("late", 1, submit=0, time_limit_s=7200, deadline=3600), 100)]
    res = Simulator(RULES, jobs, [Restart(50)]).run()
    assert [stage for _, stage, _ in res.scheduler.deadline_at_risk("late")] == ["submit", "start"]


@pytest.mark.parametrize("bad", [0.0, -5.0, float("nan"), float("inf")])
def test_a_deadline_before_submit_is_rejected(bad):
    with pytest.raises(SpecError) as exc:
        validate_spec(RULES, job("j", 1, submit=0, deadline=bad))
    assert "deadline" in str(exc.value) and "after submit_time" in str(exc.value)

"""The aged tier of the order (``priority.age_tier_s``, ``priority.age_tier_jobs``;
issue 17 point 2, design note 053). The hand-computed outcome is the scenario
``examples/scenarios/I17-02-age-tier.yaml``; the oracle draws the tier (fast core ==
reference). Here: the queue order it promises, as a Hypothesis property over drawn
workloads, and the policy errors."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import job, policy, simulate, submit
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Start
from gpushepherd.model.events import Tick
from gpushepherd.policy import PolicyError, policy_from_dict
from gpushepherd.policy.schema import DEFAULT_ORDER

RECALC = 5.0


def _checked_scheduler(seen: list):
    """A ``Scheduler`` that checks its queue's order after every ``handle`` call."""

    class Checked(Scheduler):
        def handle(self, batch):
            out = super().handle(batch)
            _check_order(self, seen, any(isinstance(d, Start) for d in out))
            return out

    return Checked


def _check_order(sched: Scheduler, seen: list, started: bool) -> None:
    book = sched.book
    pr = book.rules.priority
    pending = sched.pending_jobs()
    tiers = [j.key[0] for j in pending]
    assert tiers == sorted(tiers), f"t={book.now}: tiers out of order {tiers}"
    aged = [j for j in pending if j.key[0] != 0 and book.recalc_t - j.spec.submit_time >= pr.age_tier_s]
    lifted = [j for j in pending if j.key[0] == 1]
    # only aged jobs are lifted, and among them the oldest go first (nice is 0 here)
    assert all(j in aged for j in lifted), f"t={book.now}: a job not aged is in the aged tier"
    assert [j.spec.submit_time for j in lifted] == sorted(j.spec.submit_time for j in lifted)
    if pr.age_tier_jobs is None:
        assert lifted == aged, f"t={book.now}: aged jobs left below the aged tier"
    else:
        # no preemption here: the tier holds at most age_tier_jobs jobs, the oldest aged
        # ones (a recalculation fills it; between two, a lifted job may have started)
        assert len(lifted) <= pr.age_tier_jobs
        rest = [j for j in aged if j.key[0] == 2]
        assert all((a.spec.submit_time, a.seq) < (r.spec.submit_time, r.seq) for a in lifted for r in rest)
        if rest and len(lifted) < pr.age_tier_jobs:
            # an aged job waits below a tier with room: the next recalculation must come
            wake = sched.next_wakeup()
            assert wake is not None and wake <= book.next_recalc, f"t={book.now}: no recalculation to lift {rest[0].id}"
        if book.recalc_t == book.now and rest and not started:
            # a recalculation filled the tier (and none of it started in the same pass)
            assert len(lifted) == pr.age_tier_jobs, f"t={book.now}: the aged tier is not filled"
    seen.append(len(lifted))


jobs_st = st.lists(st.tuples(st.integers(0, 60), st.integers(1, 4), st.integers(1, 40), st.integers(1, 60),
                             st.sampled_from(["batch", "training", "sandbox", "production-inference"])),
                   min_size=1, max_size=14)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs_st, st.integers(1, 40), st.none() | st.integers(1, 2), st.booleans())
def test_aged_jobs_go_before_all_but_the_top_class_oldest_first(drawn, threshold, count, backfill):
    prio = dict(DEFAULT_ORDER, max_age_s=100.0, recalc_s=RECALC, age_tier_s=float(threshold))
    if count is not None:
        prio["age_tier_jobs"] = count
    rules = policy(nodes=[("n1", 4)], preemption=False, backfill=backfill, priority=prio)
    specs = [(job(f"j{i}", gpus=g, cls=c, submit=s, time_limit_s=float(max(d, lim))), float(d))
             for i, (s, g, d, lim, c) in enumerate(drawn)]
    seen: list[int] = []
    res = simulate(rules, specs, scheduler=_checked_scheduler(seen))
    assert all(r.end is not None for r in res.records.values())  # every job fits one node: all end
    assert seen


@pytest.mark.parametrize("field,value,allowed", [
    ("age_tier_s", 0, "greater than 0"), ("age_tier_s", -1.0, "greater than 0"),
    ("age_tier_s", float("inf"), "finite number"), ("age_tier_s", "2d", "valid number"),
    ("age_tier_jobs", 0, "greater than or equal to 1"), ("age_tier_jobs", 1.5, "valid integer"),
])
def test_a_bad_aged_tier_is_refused_naming_field_value_and_what_is_allowed(field, value, allowed):
    raw = {"cluster": {"nodes": [{"name": "n1", "gpus": 8}]}, "priority": {field: value}}
    with pytest.raises(PolicyError) as e:
        policy_from_dict(raw)
    assert f"priority.{field}" in str(e.value) and repr(value) in str(e.value) and allowed in str(e.value)



def test_a_cap_on_the_aged_tier_without_the_tier_is_refused():
    # before: accepted and silently without effect
    raw = {"cluster": {"nodes": [{"name": "n1", "gpus": 8}]}, "priority": {"age_tier_jobs": 2}}
    with pytest.raises(PolicyError) as e:
        policy_from_dict(raw)
    # the field named, not the whole priority section (a newcomer's finding)
    assert "priority.age_tier_jobs: 2 is not allowed: only with priority.age_tier_s set" in str(e.value)
    raw["priority"]["age_tier_s"] = -5.0  # an invalid tier: its own error, not a second one
    with pytest.raises(PolicyError) as e:
        policy_from_dict(raw)
    assert "priority.age_tier_s: -5.0 is not allowed" in str(e.value) and "age_tier_jobs" not in str(e.value)
    raw["priority"]["age_tier_s"] = 3600.0
    assert policy_from_dict(raw).rules is not None


def test_a_restore_keeps_the_aged_tier_while_the_rules_have_one():
    prio = dict(DEFAULT_ORDER, recalc_s=10.0, age_tier_s=20.0)
    rules = policy(nodes=[("n1", 1)], preemption=False, priority=prio)
    sched = Scheduler(rules)
    sched.handle(submit(job("run", submit=0, time_limit_s=500.0), job("old", submit=0, time_limit_s=900.0),
                        job("new", submit=25, time_limit_s=10.0)))
    sched.handle([Tick(30.0)])  # the recalculation at 30: "old" has waited 30 s, "new" 5 s
    assert {j.id: j.key[0] for j in sched.pending_jobs()} == {"old": 1, "new": 2}
    snap = json.loads(json.dumps(sched.snapshot()))
    again = Scheduler.restore(rules, snap)
    assert [(j.id, j.key) for j in again.pending_jobs()] == [(j.id, j.key) for j in sched.pending_jobs()]
    # the running job keeps the key it was queued with (tier 2 at 0), though it is aged
    # by now: a requeue brings it back under that key in both runs
    assert sched.jobs["run"].key[0] == 2 and again.jobs["run"].key == sched.jobs["run"].key
    # under rules without the aged tier no job stays in it: shortest limit first again
    plain = Scheduler.restore(policy(nodes=[("n1", 1)], preemption=False, priority=dict(prio, age_tier_s=None)),
                              snap)
    assert [(j.id, j.key[0]) for j in plain.pending_jobs()] == [("new", 2), ("old", 2)]

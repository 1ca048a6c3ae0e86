"""The oracle's ``i_share_victims`` judges each victim by the rules, not by the preemptor's
``reclaim`` flag (note 065; oracle seed 316833).

A reclaim (note 005, Kueue's ``reclaimWithinCohort``) may take a borrower's share of the
reclaimer's own class when the cohort reclaims from ``any`` class. The core clears the
preemptor's ``reclaim`` flag when it starts or lets its hold go, which may happen later in
the same instant: the check read it after the instant and reported the reclaimed share as
a forbidden class-preemption victim. The jobs are those of scenario I20-37: B's P reclaims
A's share S at 5, and the repeat pass of that instant starts P on n2, which R's
reservation no longer keeps from it (S's exit moved R to a start at which A would borrow).
"""

from __future__ import annotations

import pytest
from builders import job, node, policy_dict
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Preempt, Start
from gpushepherd.model.events import JobSubmitted
from gpushepherd.model.job import GpuShare
from oracle_checks import Checker, Report, check, drive
from oracle_workloads import Workload


def _workload(reclaim: str = "any", s_team: str = "A") -> Workload:
    raw = policy_dict(
        nodes=[node("n1", 1, sharing={"time_slicing": {"replicas": 2}}),
               node("n2", 1, labels={"zone": "b"}), node("n3", 2, labels={"zone": "c"})],
        teams={"A": {"nominal_gpus": 2, "max_running_jobs": 2}, "B": {"nominal_gpus": 2}},
        classes={"batch": {"grace_period_s": 3.0}},
        preemption={"enabled": True, "min_runtime_s": 0}, backfill=1,
        cohorts={"co": {"members": ["A", "B"], "reclaim": reclaim}})
    share = GpuShare("time_slice", slots=1, mem_mib=8192)
    jobs = [(job("X", 2, "training", "A", 0, preemptible=False, node_selector=(("zone", "c"),),
                 runtime_estimate_s=21.0), 21.0),
            (job("S", 1, "batch", s_team, 0, share=share, runtime_estimate_s=100.0), 100.0),
            (job("R", 1, "research-training", "A", 1, node_selector=(("zone", "b"),), runtime_estimate_s=10.0), 10.0),
            (job("P", 1, "batch", "B", 5, runtime_estimate_s=30.0), 30.0)]
    return Workload(raw, jobs, [])


def test_a_reclaimer_that_starts_elsewhere_in_the_same_instant_passes_the_oracle():
    wl = _workload()
    rep = check(wl)  # fast == reference, and every property of the oracle
    assert [str(f) for f in rep.failures] == []
    assert rep.counts["i_share_victims"] == 1
    for reference in (False, True):
        _result, calls = drive(wl, reference=reference, restarts=False)
        at5 = [d for c in calls if c.t == 5.0 for d in c.decisions]
        preempts = [(d.job_id, d.reason, d.preemptor, d.grace_s) for d in at5 if isinstance(d, Preempt)]
        starts = [(d.job_id, d.placement.parts) for d in at5 if isinstance(d, Start)]
        assert preempts == [("S", "reclaim", "P", 3.0)]
        assert starts == [("P", (("n2", (0,)),))]  # not on n1, whose card S leaves at 8


def _state_at_5(wl: Workload) -> Scheduler:
    sched = Scheduler(wl.rules)
    for spec, _d in wl.jobs:
        sched.handle([JobSubmitted(spec.submit_time, spec)])
    return sched


@pytest.mark.parametrize(("reclaim", "s_team", "allowed"), [
    ("any", "A", True),  # A borrows, B within its nominal: reclaim takes any class
    ("lower_priority", "A", False),  # S is of P's class
    ("never", "A", False),
    # S is of P's own team: no reclaim may take it, and it is not of a lower class (here P
    # is reclaiming A's R at 5: the old check excused every victim of a reclaiming preemptor)
    ("any", "B", False),
])
def test_a_same_class_share_victim_is_allowed_only_to_a_reclaim(reclaim, s_team, allowed):
    wl = _workload(reclaim, s_team)
    sched = _state_at_5(wl)
    rep = Report()
    Checker(wl, rep).share_victims(sched.book, [Preempt(5.0, "S", grace_s=3.0, reason="reclaim", preemptor="P")])
    failed = [str(f) for f in rep.failures if f.prop == "i_share_victims"]
    assert (failed == []) is allowed, failed

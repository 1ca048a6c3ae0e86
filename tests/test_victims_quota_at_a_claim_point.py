"""A preemption plan asks the admission rule with its victims gone; rule 9 reads the
claims' quota spare at each claim point, which counts every running job planned to hold
the quota then - the plan's victims too. What the victims hold there comes back to the
plan only where no claim binds the job: a victim is queued again, and one that ranks
ahead of a claim's job then may take the quota back first (its key now does not say:
a running job's key is not recalculated). Oracle seeds 326283, 342188 (a
reclaim refused at a point no claim bound, read ``ReservedFor`` naming no job), design
note 067, scenario I20-50. Both cores.
"""

from __future__ import annotations

import pytest
from builders import job, node, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Start
from gpushepherd.model.events import JobFinished, JobSubmitted, Tick
from gpushepherd.model.job import ExitStatus

A = (("zone", "a"),)
B = (("zone", "b"),)


def _cohort_rules(nodes, b: dict, a: dict | None = None, min_runtime: float = 0.0):
    """Team a (nominal 0) borrows from b in cohort co (reclaim any); team c is outside."""
    return policy(nodes=nodes, preemption={"enabled": True, "min_runtime_s": min_runtime}, backfill=3,
                  teams={"a": {"nominal_gpus": 0, **(a or {})}, "b": b, "c": {}},
                  cohorts={"co": {"members": ["a", "b"], "reclaim": "any"}})


def _sub(t: float, jid: str, gpus: int, cls: str, team: str, est: float, **kw) -> JobSubmitted:
    """``jid`` submitted at ``t`` with a runtime estimate of ``est`` seconds."""
    return JobSubmitted(t, job(jid, gpus, cls, team, t, runtime_estimate_s=est, **kw))


def _brief(out) -> list:
    return [(type(d).__name__, d.job_id, getattr(d, "reason", None), getattr(d, "preemptor", None)) for d in out]


def _starts(out) -> list:
    return [d.job_id for d in out if isinstance(d, Start)]


@pytest.mark.parametrize("reference", [False, True])
def test_a_reclaim_at_a_point_no_claim_binds_gets_its_victims_quota_back(reference):
    # oracle seed 326283's shape: n1 (4 GPUs) holds Y (b, production inference), W (a,
    # u1, to 10) and A1 (team a, sandbox, 2 GPUs, to 100: a borrows); n2 (1 GPU) holds X
    # (team c). The cohort is 4, all in use. R (a, u1) waits for a's per-user limit (W):
    # a reservation at 10 that P may reclaim from (a would borrow then), so it does not
    # bind P. P (b, batch, 2 GPUs) comes at 2; A1 is young until 5 (min_runtime 5). With
    # A1 gone the cohort has 2 now. The claims' spare at 10 is 4 - Y - A1 - R = 0, plus
    # R's 1 (exempt): 1, for A1 counted there (it runs to 100). No claim but R's, which
    # does not bind, holds the cohort at 10: A1's 2 come back, 3. P waits for A1's age
    # and reclaims it at 5. Before, the plan was refused there, and the refusal's claim,
    # looked for, was none: "ReservedFor" naming no job, and P reclaimed only at 10.
    rules = _cohort_rules([node("n1", 4, labels={"zone": "a"}), node("n2", 1, labels={"zone": "b"})],
                          {"nominal_gpus": 4}, {"max_running_jobs_per_user": 1}, min_runtime=5.0)
    sched = Scheduler(rules, reference=reference)
    sched.handle([_sub(0, "Y", 1, "production-inference", "b", 100, node_selector=A),
                  _sub(0, "W", 1, "batch", "a", 10, user="u1", node_selector=A),
                  _sub(0, "A1", 2, "sandbox", "a", 100, user="u2", node_selector=A),
                  _sub(0, "X", 1, "production-inference", "c", 100, node_selector=B)])
    assert sched.handle([_sub(1, "R", 1, "batch", "a", 50, user="u1")]) == []
    assert sched.handle([_sub(2, "P", 2, "batch", "b", 50, user="u3")]) == []
    assert str(sched.pending_reason("P")) == "NoPreemptibleVictims(min_runtime: victims eligible at t=5)"
    assert sched.next_wakeup() == 5.0
    assert _brief(sched.handle([Tick(5.0)])) == [("Preempt", "A1", "reclaim", "P")]


def _reclaim_beside(r_cls: str, reference: bool) -> Scheduler:
    # n1 has 4 GPUs, the cohort 4 (b's nominal). A1 (team a, batch, 2 GPUs, to 100)
    # borrows; B1 (b, u1) runs to 10. R (b, u1, class ``r_cls``) waits for b's per-user
    # limit: its reservation takes 1 GPU and 1 of the cohort at 10. P (b, u2, batch, 2
    # GPUs) comes at 2: 1 GPU is free, b is within its nominal, so P may reclaim A1. With
    # A1 gone the cohort has 3 now, 4 - B1... and at 10 (B1 gone) 4 - R's 1 = 3 less P's 2:
    # 1, too little for A1 (2) - if R goes first. The claims' spare at 10 counts A1 (it
    # runs to 100): 4 - A1 - R = 1, and P's 2 fit only with A1's 2 back.
    sched = Scheduler(_cohort_rules([("n1", 4)], {"nominal_gpus": 4, "max_running_jobs_per_user": 1}),
                      reference=reference)
    sched.handle([_sub(0, "A1", 2, "batch", "a", 100), _sub(0, "B1", 1, "batch", "b", 10, user="u1")])
    assert sched.handle([_sub(1, "R", 1, r_cls, "b", 50, user="u1")]) == []
    return sched


@pytest.mark.parametrize("reference", [False, True])
def test_a_reclaim_does_not_count_the_quota_of_a_victim_ranked_behind_the_claims_job_now(reference):
    # R is training: it ranks ahead of A1 (batch) now. A victim's rank when it is queued
    # again is not its key now (the next test), so where R's claim binds, A1's 2 do not
    # come back at 10: P waits (1 GPU free) and at 10, R started, reclaims A1 and starts
    # when it leaves. (The merged second fix reclaimed at 2 on the rank now.)
    sched = _reclaim_beside("training", reference)
    assert sched.handle([_sub(2, "P", 2, "batch", "b", 50, user="u2")]) == []
    assert str(sched.pending_reason("P")) == "Resources"
    assert _brief(sched.handle([JobFinished(10.0, "B1", ExitStatus.COMPLETED)])) == [
        ("Start", "R", None, None), ("Preempt", "A1", "reclaim", "P")]
    assert _starts(sched.handle([JobFinished(10.0, "A1", ExitStatus.PREEMPTED)])) == ["P"]


@pytest.mark.parametrize("prio", [{"age_tier_s": 5, "recalc_s": 10},
                                  {"weights": {"age": 1000}, "max_age_s": 1000, "recalc_s": 10}])
@pytest.mark.parametrize("reference", [False, True])
def test_no_reclaim_of_a_victim_whose_key_now_hides_that_it_ranks_ahead_when_queued_again(reference, prio):
    # the review of the merged second fix: a running job's key is not recalculated, so
    # under the aged tier or an age weight A1 (running since 0) reads behind R (rekeyed at
    # 10) at 12. Counted back at R's claim point (30), P reclaimed A1 at 12; A1, queued
    # again and rekeyed at 20, ranked ahead of R and took the cohort back at 30: R waited,
    # the eviction bought it nothing. Now nothing comes back where R's claim binds: R
    # starts at 30 on its reservation.
    rules = policy(nodes=[("n1", 4)], preemption={"enabled": True, "min_runtime_s": 0.0}, backfill=3,
                   teams={"a": {"nominal_gpus": 0}, "b": {"nominal_gpus": 4, "max_running_jobs_per_user": 1}},
                   cohorts={"co": {"members": ["a", "b"], "reclaim": "any"}}, priority=prio)
    sched = Scheduler(rules, reference=reference)
    sched.handle([_sub(0, "A1", 2, "batch", "a", 100), _sub(0, "B1", 1, "batch", "b", 30, user="u1")])
    sched.handle([_sub(1, "R", 1, "batch", "b", 50, user="u1")])
    sched.handle([Tick(10.0)])
    assert sched.handle([_sub(12, "P", 2, "batch", "b", 50, user="u2")]) == []
    sched.handle([Tick(20.0)])
    assert "R" in _starts(sched.handle([JobFinished(30.0, "B1", ExitStatus.COMPLETED)]))


@pytest.mark.parametrize("reference", [False, True])
def test_a_reclaim_does_not_count_the_quota_of_a_victim_ranked_ahead_of_the_claims_job(reference):
    # R is batch, submitted after A1: A1 ranks ahead. Evicted, A1 would take the cohort
    # back at 10 before R's turn (4 - P's 2 = 2, A1's 2): R waits for P, and the eviction
    # bought R's reservation nothing (note 067's review; the merged change did this).
    # Its quota does not come back at 10: P waits for GPUs (1 free; a reclaim's reason
    # reads no plan) and R starts at 10.
    sched = _reclaim_beside("batch", reference)
    assert sched.handle([_sub(2, "P", 2, "batch", "b", 50, user="u2")]) == []
    assert str(sched.pending_reason("P")) == "Resources"
    assert _starts(sched.handle([JobFinished(10.0, "B1", ExitStatus.COMPLETED)])) == ["R"]

"""A preemption plan asks the admission rule with its victims gone (``admission.Scratch``);
rule 9 (the claims of reservations and holds) must read that world too, and a refusal
there must name the claim that binds there (oracle seed 326283, issue 20 point 12,
design note 067, scenario I20-39). Both cores.

The claims' spare of a quota key at a claim point, and a claim's class-hold slack, count
every running job planned to hold GPUs or quota then; a victim gone gives them back at
that point too. Read without that, a preemption or reclaim that leaves every reservation
whole was refused by the claims, and the reason, named against the world with the
victims still running, found no claim that binds (``ReservedFor`` with no job) or one
that does not bind with the victims gone.
"""

from __future__ import annotations

import pytest
from builders import job, node, placed, policy
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


@pytest.mark.parametrize("reference", [False, True])
def test_a_reclaim_is_not_refused_by_a_reservation_its_victims_quota_leaves_whole(reference):
    # n1 has 4 GPUs, the cohort 4 (b's nominal). A1 (team a, 2 GPUs, to 100) borrows; B1
    # (b, u1) runs to 10. R (b, u1) waits for b's per-user limit: its reservation takes 1
    # GPU and 1 of the cohort at 10. P (b, u2, 2 GPUs) comes at 2: 1 GPU is free, b is
    # within its nominal, so P may reclaim A1. With A1 gone the cohort has 3 left now,
    # and at 10 (B1 gone, R in) 4 - 1 - 1 = 2: P fits beside R's reservation. The claims'
    # spare at 10 counted A1 there (it runs to 100): 1 left, and P was refused for good.
    sched = Scheduler(_cohort_rules([("n1", 4)], {"nominal_gpus": 4, "max_running_jobs_per_user": 1}),
                      reference=reference)
    sched.handle([_sub(0, "A1", 2, "batch", "a", 100), _sub(0, "B1", 1, "batch", "b", 10, user="u1")])
    assert sched.handle([_sub(1, "R", 1, "batch", "b", 50, user="u1")]) == []
    out = sched.handle([_sub(2, "P", 2, "batch", "b", 50, user="u2")])
    assert _brief(out) == [("Preempt", "A1", "reclaim", "P")]
    assert str(sched.pending_reason("P")) == "PreemptionInProgress(A1)"


def _young_victim(reference: bool) -> Scheduler:
    # oracle seed 326283's shape: n1 (4 GPUs) holds Y (b, production inference), W (b,
    # u1, to 10) and A1 (team a, sandbox, 2 GPUs, to 100: a borrows); n2 (1 GPU) holds X
    # (team c). The cohort is 4, all in use. R (a, u1) waits for a's per-user limit
    # (W): a reservation at 10 that P may reclaim from (a would borrow), so it does not
    # bind P. P (b, batch, 2 GPUs) comes at 2; A1 is young until 5 (min_runtime 5).
    rules = _cohort_rules([node("n1", 4, labels={"zone": "a"}), node("n2", 1, labels={"zone": "b"})],
                          {"nominal_gpus": 4}, {"max_running_jobs_per_user": 1}, min_runtime=5.0)
    sched = Scheduler(rules, reference=reference)
    sched.handle([_sub(0, "Y", 1, "production-inference", "b", 100, node_selector=A),
                  _sub(0, "W", 1, "batch", "a", 10, user="u1", node_selector=A),
                  _sub(0, "A1", 2, "sandbox", "a", 100, user="u2", node_selector=A),
                  _sub(0, "X", 1, "production-inference", "c", 100, node_selector=B)])
    assert sched.handle([_sub(1, "R", 1, "batch", "a", 50, user="u1")]) == []
    return sched


@pytest.mark.parametrize("reference", [False, True])
def test_a_preemptor_waiting_for_a_young_victim_reads_when_not_an_empty_reservation(reference):
    # with A1 gone the cohort has 2 for P now; at 10 the claims' spare, 4 - Y - A1 - R =
    # 0, plus R's 1 (exempt) plus A1's 2 (counted there: it runs to 100) is 3. A1 would
    # do once of age. P read "ReservedFor" naming no job (the refusal's claim was looked
    # for with A1 running, where the only claim, R's, does not bind P) and reclaimed A1
    # only once R had started (at 10, in scenario I20-39).
    sched = _young_victim(reference)
    assert sched.handle([_sub(2, "P", 2, "batch", "b", 50, user="u3")]) == []
    assert str(sched.pending_reason("P")) == "NoPreemptibleVictims(min_runtime: victims eligible at t=5)"
    assert sched.next_wakeup() == 5.0
    assert _brief(sched.handle([Tick(5.0)])) == [("Preempt", "A1", "reclaim", "P")]


@pytest.mark.parametrize("reference", [False, True])
def test_a_refused_plan_names_the_reservation_that_binds_with_its_victims_gone(reference):
    # n1 (5 GPUs): Y (b), W (b, u1, to 10), Z (b, u5, to 20), A1 (team a, sandbox, to
    # 100), 1 free; n2 (3 GPUs) X (team c, to 20). Cohort 5 (b's nominal), b max_gpus 5.
    # R (b, u1, 1 GPU for 5 s) reserves 10-15; R2 (b, u5, 3 GPUs on n2) reserves 20-70.
    # P (b, 2 GPUs, 50 s) at 2 may reclaim A1: with A1 gone R's reservation leaves P
    # room (at 10 the cohort has 1 left, 2 with A1's back), but at 20, R gone, R2's 3
    # GPUs leave the cohort 1 (A1's) and b's max_gpus 1: P is refused by R2's. The
    # reason named R - the first claim that binds with A1 still running - whose
    # reservation ends before R2's starts: without it P is still refused, without R2's
    # it reclaims A1.
    rules = _cohort_rules([node("n1", 5, labels={"zone": "a"}), node("n2", 3, labels={"zone": "b"})],
                          {"nominal_gpus": 5, "max_gpus": 5, "max_running_jobs_per_user": 1})
    sched = Scheduler(rules, reference=reference)
    sched.handle([_sub(0, "Y", 1, "production-inference", "b", 100, user="u0", node_selector=A),
                  _sub(0, "W", 1, "batch", "b", 10, user="u1", node_selector=A),
                  _sub(0, "Z", 1, "batch", "b", 20, user="u5", node_selector=A),
                  _sub(0, "A1", 1, "sandbox", "a", 100, user="u2", node_selector=A),
                  _sub(0, "X", 3, "production-inference", "c", 20, node_selector=B)])
    assert sched.handle([_sub(1, "R", 1, "batch", "b", 5, user="u1")]) == []
    assert sched.handle([_sub(1.5, "R2", 3, "batch", "b", 50, user="u5", node_selector=B)]) == []
    assert sched.handle([_sub(2, "P", 2, "batch", "b", 50, user="u3")]) == []
    assert str(sched.pending_reason("P")) == "ReservedFor(R2)"


@pytest.mark.parametrize("reference", [False, True])
def test_a_preemption_is_not_refused_by_a_class_hold_slack_its_victims_leave_whole(reference):
    # n1 has 4 GPUs; production inference reserves 1 (unused). V (sandbox, 2 GPUs, to
    # 100) and W (training, u1, to 10) run, 1 GPU is free. R (training, u1) waits for the
    # per-user limit: its reservation takes 1 GPU at 10, and its class-hold slack there is
    # 0 (2 free at 10, R's 1, the reservation's 1). P (training, 2 GPUs) comes at 2 and
    # may evict V: with V gone 3 GPUs are free now (1 kept for the reservation) and 4 at
    # 10 (R's 1, the reservation's 1, P's 2). The slack read without V's GPUs (busy
    # there by its planned end) refused P: ReservedFor(R), which does not hold the room.
    rules = policy(nodes=[("n1", 4)], preemption={"enabled": True, "min_runtime_s": 0}, backfill=3,
                   classes={"production-inference": {"reserved_gpus": 1}},
                   teams={"t": {"max_running_jobs_per_user": 1}})
    sched = Scheduler(rules, reference=reference)
    sched.handle([_sub(0, "V", 2, "sandbox", "t", 100, user="u2"), _sub(0, "W", 1, "training", "t", 10, user="u1")])
    assert sched.handle([_sub(1, "R", 1, "training", "t", 50, user="u1")]) == []
    out = sched.handle([_sub(2, "P", 2, "training", "t", 50, user="u3")])
    assert _brief(out) == [("Preempt", "V", "priority:training", "P")]
    assert str(sched.pending_reason("P")) == "PreemptionInProgress(V)"
    started = sched.handle([JobFinished(2.0, "V", ExitStatus.PREEMPTED)])
    assert [(d.job_id, placed(d)) for d in started if isinstance(d, Start)] == [("P", {"n1": (1, 2)})]
    started = sched.handle([JobFinished(10.0, "W", ExitStatus.COMPLETED)])  # R's reservation held
    assert [(d.job_id, placed(d)) for d in started if isinstance(d, Start)] == [("R", {"n1": (0,)})]

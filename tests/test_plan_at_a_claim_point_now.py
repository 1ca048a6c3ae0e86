"""A preemption plan at a claim point at now, with a victim past its planned end (design
note 086; oracle seed 480204; the class of note 064, item 1: a job past its planned end
gone on one side of a sum and present on the other). Both cores.

A reservation starts now when the GPUs it needs are held by a job past its planned end
(such a job is taken to end now). The spare at a claim point at or before now reads the
GPUs free now (``releases.free_mask_at``): the job past its end holds its GPUs there. A
plan's scratch state added back at a point only the victims planned past it
(``Scratch.extra_at``, ``end > p``): a victim past its planned end was counted neither
in the spare nor in what the plan frees, and the plan lost its GPUs. The same spare was
read by planned ends (the job gone) when the pass's walk handed its free counts to the
point (``Profile._add_point``'s ``free_at``), and by the free GPUs when the reasons'
profile was built again: one point, two values.
"""

from __future__ import annotations

import pytest
from builders import job, node, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Start
from gpushepherd.model.events import JobFinished, JobSubmitted, Tick
from gpushepherd.model.job import ExitStatus

#: queue order by submit time alone, whatever the class (as in the seed)
FLAT = {"weights": {"class": 0.0}}


def _sub(t: float, jid: str, gpus: int, cls: str, team: str, est: float) -> JobSubmitted:
    """``jid`` submitted at ``t`` with a runtime estimate of ``est`` seconds."""
    return JobSubmitted(t, job(jid, gpus, cls, team, t, runtime_estimate_s=est))


def _brief(out) -> list:
    return [(type(d).__name__, d.job_id, getattr(d, "reason", None), getattr(d, "preemptor", None)) for d in out]


def _starts(out) -> list:
    return [d.job_id for d in out if isinstance(d, Start)]


@pytest.mark.parametrize("reference", [False, True])
def test_a_reclaim_past_an_exempt_reservation_at_now(reference):
    # seed 480204's shape. n1 has 2 GPUs; cohort co is a (nominal 1), b (0), c (1).
    # V (a, batch, 2 GPUs, estimate 1) runs from 0: a borrows 1. R (b, batch, 2 GPUs)
    # comes at 1; at 2 V is past its planned end, so R's reservation starts now, on
    # n1's 2 GPUs (b would borrow them all). P (c, training, 1 GPU) comes at 2, behind R
    # in the queue: c is within its nominal, so R's reservation does not bind P (P would
    # reclaim from R at its start: Profile.reclaimers_of). With V gone, 2 GPUs are free
    # and nothing else claims them: P reclaims V. Before, the spare at 2 read V's GPUs
    # busy (0 - R's 2) and the plan added nothing back for V (past its end): the plan was
    # refused by the claims, nobody was evicted, and P read "ReservedFor" naming no job
    # (its claim looked for on the live book, where only R's exempt one is).
    rules = policy(nodes=[node("n1", 2)], preemption={"enabled": True, "min_runtime_s": 0.0}, backfill=3,
                   teams={"a": {"nominal_gpus": 1}, "b": {"nominal_gpus": 0}, "c": {"nominal_gpus": 1}},
                   cohorts={"co": {"members": ["a", "b", "c"], "reclaim": "any"}}, priority=FLAT)
    sched = Scheduler(rules, reference=reference)
    assert _starts(sched.handle([_sub(0, "V", 2, "batch", "a", 1)])) == ["V"]
    assert sched.handle([_sub(1, "R", 2, "batch", "b", 10)]) == []
    out = sched.handle([_sub(2, "P", 1, "training", "c", 50)])
    assert _brief(out) == [("Preempt", "V", "reclaim", "P")]
    assert str(sched.pending_reason("P")) == "PreemptionInProgress(V)"
    assert _starts(sched.handle([JobFinished(2, "V", ExitStatus.PREEMPTED)]))[:1] == ["P"]


@pytest.mark.parametrize("reference", [False, True])
def test_a_plan_reads_the_spare_at_now_as_the_free_gpus(reference):
    # n1 has 3 GPUs: V (batch, 2 GPUs, estimate 1) and X (batch, 1 GPU, to 100) run from
    # 0. R (batch, 1 GPU) comes at 1; at 2 V is past its planned end: R's reservation
    # starts now (n1, 1 GPU), and the pass's walk handed the point its free count by
    # planned ends (2, V gone): spare 1. P (training, 1 GPU), behind R, comes at 2 and
    # may evict either. Evicting X frees 1 GPU now, which R's reservation needs now: P
    # would take it and R would wait for V's real end. Evicting V frees 2: one for P, one
    # for R. Before, the pass's point read V gone (spare 1) and X's plan passed; the
    # profile the reasons read, built again, read the free GPUs (-1): one point, two values.
    rules = policy(nodes=[node("n1", 3)], preemption={"enabled": True, "min_runtime_s": 0.0}, backfill=3,
                   priority=FLAT)
    sched = Scheduler(rules, reference=reference)
    assert _starts(sched.handle([_sub(0, "V", 2, "batch", "t", 1), _sub(0, "X", 1, "batch", "t", 100)])) == ["V", "X"]
    assert sched.handle([_sub(1, "R", 1, "batch", "t", 10)]) == []
    assert sched.handle([Tick(2.0)]) == []
    turn = sched.last_turn
    turn.materialize()
    assert [(c.job_id, c.start) for c in turn.profile.claims] == [("R", 2.0)]
    # the pass's point reads the free GPUs less R's, as the profile the reasons read
    # (``Scheduler.profile_for``, built again without the walk's counts) always did
    assert turn.profile.spare[2.0] == {0: -1}
    out = sched.handle([_sub(2, "P", 1, "training", "t", 50)])
    assert _brief(out) == [("Preempt", "V", "priority:training", "P")]
    assert sorted(_starts(sched.handle([JobFinished(2, "V", ExitStatus.PREEMPTED)]))) == ["P", "R"]

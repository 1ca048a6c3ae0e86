"""A preemption plan refused by another class's ``reserved_gpus`` (on the state without
its victims), then a share of that class filling the reservation on a card in the same
pass: the class hold loosens, and the decisions of the instant must be those of a full
pass on its final state - the refused job preempts (oracle seed 326198, issue 20 points
4 and 11; note 066, scenario I20-38). Both cores; a core restored after the instant
decides nothing more.

The case, by hand: n1 has 2 GPUs; training reserves 1. W (sandbox, 1 GPU) starts at 0
on GPU 0 (the free GPU left covers training's reservation); T1 (training, half a GPU)
opens GPU 1 at 1, filling half of training's reservation. The job P (1 GPU, of a class
above sandbox) finds no free GPU; evicting W would leave GPU 0 free, but training's
reservation lacks half a GPU and no whole GPU would be left for it: P's plan is
refused (``ReservedFor(classes.training.reserved_gpus)``). At 10 T2 (training, half a
GPU) joins T1's card: training holds its whole reserved GPU, and a full pass evicts W
for P. The pass that started T2 had turned P before it.
"""

from __future__ import annotations

import json

import pytest
from builders import job, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.events import JobSubmitted, Tick
from gpushepherd.model.job import GpuShare

HALF = GpuShare("fraction", milli=500)


def _brief(out) -> list:
    return [(type(d).__name__, d.job_id, getattr(d, "preemptor", None)) for d in out]


def _restored_decides_nothing(sched: Scheduler, rules) -> None:
    restored = Scheduler.restore(rules, json.loads(json.dumps(sched.snapshot())))
    assert restored.handle([Tick(sched.now)]) == []


@pytest.mark.parametrize("together", [False, True])
@pytest.mark.parametrize("reference", [False, True])
def test_a_share_filling_its_class_reservation_lets_a_refused_preemption_through(reference, together):
    rules = policy(nodes=[("n1", 2)], classes={"training": {"reserved_gpus": 1}},
                   preemption={"enabled": True, "min_runtime_s": 0})
    sched = Scheduler(rules, reference=reference)
    assert _brief(sched.handle([JobSubmitted(0.0, job("W", 1, "sandbox", "t", 0))])) == [("Start", "W", None)]
    assert _brief(sched.handle([JobSubmitted(1.0, job("T1", 1, "training", "t", 1, share=HALF))])) == [
        ("Start", "T1", None)]
    p = JobSubmitted(5.0 if not together else 10.0, job("P", 1, "production-inference", "t", 5))
    if not together:
        assert sched.handle([p]) == []
        assert str(sched.pending_reason("P")) == "ReservedFor(classes.training.reserved_gpus)"
    out = sched.handle(([p] if together else []) + [JobSubmitted(10.0, job("T2", 1, "training", "t", 10, share=HALF))])
    assert _brief(out) == [("Start", "T2", None), ("Preempt", "W", "P")]
    assert str(sched.pending_reason("P")) == "PreemptionInProgress(W)"
    _restored_decides_nothing(sched, rules)


@pytest.mark.parametrize("reference", [False, True])
def test_a_share_filling_its_class_reservation_lets_a_refused_preemption_within_the_team_through(reference):
    # the same with preemption off and J at its team's limit: J may evict W, of its own
    # team, for that limit (note 035); the plan is refused by training's reservation too
    rules = policy(nodes=[("n1", 2)], classes={"training": {"reserved_gpus": 1}}, preemption=False,
                   teams={"T": {"max_gpus": 1, "preemption": {"within_team": "lower_priority"}}, "U": {}})
    sched = Scheduler(rules, reference=reference)
    sched.handle([JobSubmitted(0.0, job("W", 1, "sandbox", "T", 0))])
    sched.handle([JobSubmitted(1.0, job("T1", 1, "training", "U", 1, share=HALF))])
    assert sched.handle([JobSubmitted(5.0, job("J", 1, "production-inference", "T", 5))]) == []
    out = sched.handle([JobSubmitted(10.0, job("T2", 1, "training", "U", 10, share=HALF))])
    assert _brief(out) == [("Start", "T2", None), ("Preempt", "W", "J")]
    _restored_decides_nothing(sched, rules)

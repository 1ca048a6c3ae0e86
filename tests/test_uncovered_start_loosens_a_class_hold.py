"""A start of a class with ``reserved_gpus`` on a card (no free whole GPU taken) that its
class's reservation does not cover *now* - a running job of the class or a preemptor's
hold covers it - still fills that reservation on the state a preemption plan or a
hold's slack reads, without the victims: the class hold loosens there, and the
decisions of the instant must be those of a full pass on its final state (oracle seeds
368854 and 369771, issue 20 points 4 and 11; note 074, scenario I20-47). Both cores;
a core restored after the instant decides nothing more.

Plan, by hand: n1 has 2 GPUs; the class R reserves 1. T1 (R, 3/4 of a GPU, not
preemptible) opens GPU 0; V (R, 1 GPU, evictable) takes GPU 1 and covers the last
quarter of R's reservation. P (1 GPU, a class above R) finds no free GPU; evicting V
would leave R a quarter short with no whole GPU free: the plan is refused. T2 (R, 1/4) then joins T1's card. It is
covered by nothing (V covers the reservation now), but without V R holds its whole
reserved GPU, and a full pass evicts V for P.

Hold, by hand: n1 (zone a) has 2 GPUs, n2 (zone b) 1; training reserves 1. T1
(training, 1/2, zone a) opens n1:0; W (sandbox, zone a, 30 s grace) takes n1:1; H
(training, 1 GPU, zone a) evicts W and holds n1:1, covering the rest of training's
reservation. K (production inference, 2 GPUs, zone a) can never fit beside T1's card
and takes the one reservation slot. J (production inference, 1 GPU) is refused n2:0 by
training's class hold. T2 (training, 1/2, zone a) joins T1's card, covered by nothing
(H's hold covers the rest); training now holds its reserved GPU, and J starts on n2:0.
"""

from __future__ import annotations

import json

import pytest
from builders import job, node, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.events import JobSubmitted, Tick
from gpushepherd.model.job import GpuShare

QUARTER = GpuShare("fraction", milli=250)
HALF = GpuShare("fraction", milli=500)
THREE_QUARTERS = GpuShare("fraction", milli=750)
ZONE_A = (("zone", "a"),)


def _brief(out) -> list:
    return [(type(d).__name__, d.job_id, getattr(d, "preemptor", None)) for d in out]


def _restored_decides_nothing(sched: Scheduler, rules) -> None:
    restored = Scheduler.restore(rules, json.loads(json.dumps(sched.snapshot())))
    assert restored.handle([Tick(sched.now)]) == []


@pytest.mark.parametrize("reserved,above", [("training", "production-inference"), ("batch", "research-training")])
@pytest.mark.parametrize("together", [False, True])
@pytest.mark.parametrize("reference", [False, True])
def test_a_share_its_reservation_does_not_cover_now_lets_a_refused_preemption_through(reference, together, reserved,
                                                                                     above):
    rules = policy(nodes=[("n1", 2)], classes={reserved: {"reserved_gpus": 1}},
                   preemption={"enabled": True, "min_runtime_s": 0})
    sched = Scheduler(rules, reference=reference)
    assert _brief(sched.handle([JobSubmitted(0.0, job("T1", 1, reserved, "t", 0, share=THREE_QUARTERS, preemptible=False))])) == [
        ("Start", "T1", None)]
    assert _brief(sched.handle([JobSubmitted(1.0, job("V", 1, reserved, "t", 1, checkpointable=True))])) == [
        ("Start", "V", None)]
    p = JobSubmitted(5.0 if not together else 10.0, job("P", 1, above, "t", 5))
    if not together:
        assert sched.handle([p]) == []
        assert str(sched.pending_reason("P")) == f"ReservedFor(classes.{reserved}.reserved_gpus)"
    out = sched.handle(([p] if together else []) + [JobSubmitted(10.0, job("T2", 1, reserved, "t", 10,
                                                                             share=QUARTER))])
    assert _brief(out) == [("Start", "T2", None), ("Preempt", "V", "P")]
    assert str(sched.pending_reason("P")) == "PreemptionInProgress(V)"
    _restored_decides_nothing(sched, rules)


@pytest.mark.parametrize("reference", [False, True])
def test_a_share_a_hold_covers_for_now_loosens_the_class_hold_that_refused_a_job(reference):
    rules = policy(nodes=[node("n1", 2, labels={"zone": "a"}), node("n2", 1, labels={"zone": "b"})], backfill=1,
                   classes={"training": {"reserved_gpus": 1}, "sandbox": {"grace_period_s": 30}},
                   preemption={"enabled": True, "min_runtime_s": 0})
    sched = Scheduler(rules, reference=reference)
    sched.handle([JobSubmitted(0.0, job("T1", 1, "training", "t", 0, share=HALF, node_selector=ZONE_A))])
    sched.handle([JobSubmitted(0.0, job("W", 1, "sandbox", "t", 0, node_selector=ZONE_A))])
    assert _brief(sched.handle([JobSubmitted(1.0, job("H", 1, "training", "t", 1, node_selector=ZONE_A))])) == [
        ("Preempt", "W", "H")]
    sched.handle([JobSubmitted(1.5, job("K", 2, "production-inference", "t", 1.5, node_selector=ZONE_A))])
    assert sched.handle([JobSubmitted(2.0, job("J", 1, "production-inference", "t", 2))]) == []
    assert str(sched.pending_reason("J")) == "ReservedFor(classes.training.reserved_gpus)"
    out = sched.handle([JobSubmitted(3.0, job("T2", 1, "training", "t", 3, share=HALF, node_selector=ZONE_A))])
    assert _brief(out) == [("Start", "T2", None), ("Start", "J", None)]
    assert out[1].placement.parts == (("n2", (0,)),)
    _restored_decides_nothing(sched, rules)

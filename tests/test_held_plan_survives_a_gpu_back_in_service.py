"""A preemptor whose victims are gone starts on the GPUs its plan held, though a GPU came
back into service on a node of the plan since (oracle seed 381805, property e; note 073).

A job larger than any node (``Shape.mode == "multi"``) is placed on whole free nodes,
largest first, then one remainder node (``placement.place_counts``): "whole" is judged by
the node's GPUs in service (``Slot.healthy``). Step 3 of the pass starts a preemptor whose
victims have all left on its plan (``Admission.decide(within=plan)``). A plan that took a
node whole while one of its GPUs was out of service no longer read as whole once that GPU
came back: with the remainder node, the plan had two partial nodes, the placement rule
refused it, the preemptor let its hold go, and jobs queued ahead took the GPUs its victims
had freed for it (in the seed: j7 evicted j2 and j4 at 47, n3's GPU 1 came back at 51, and
at 53 j4 and j2 started again where j7 should have).

The case, by hand: n1 and n2 have 4 GPUs, n3 has 2; n3's GPU 1 is unhealthy from 0;
sandbox's grace is 100 s; a victim needs no minimum runtime. At 0 X (training, 2 GPUs, not
preemptible) starts on n1:0,1, V (sandbox, 4 GPUs) on n2 and W (sandbox, 2 GPUs) on
n1:2,3. At 2 P (batch, 6 GPUs, not preemptible) finds one free GPU (n3:0) and evicts V and
W: once they leave, n2 (4 of 4) and n3 (1 of 1) are whole, and the remainder, 1 GPU, goes
on n1 (2 free, best fit): its plan is n2 4, n3 1, n1 1. At 3 n3's GPU 1 is healthy again.
At 4 Q (training, 4 GPUs) comes, ahead of P in the queue; no node has 4 GPUs free outside
P's hold: Resources. At 102 V and W are gone: P starts on n2:0-3, n3:0, n1:2 before anyone.
Before the fix n3 read 1 of 2 (partial) beside n1 1 of 4: P let its hold go, Q took n2 and
W came back on n1:2,3, and P read Resources.
"""

from __future__ import annotations

import json

import pytest
from builders import job, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.events import GpuHealthChanged, JobFinished, JobSubmitted
from gpushepherd.model.job import ExitStatus

RULES = policy(nodes=[("n1", 4), ("n2", 4), ("n3", 2)], classes={"sandbox": {"grace_period_s": 100}},
               preemption={"enabled": True, "min_runtime_s": 0})


def _brief(out) -> list:
    return [(type(d).__name__, d.job_id, str(d.placement) if hasattr(d, "placement") else d.preemptor)
            for d in out]


def _restored(sched: Scheduler, reference: bool) -> Scheduler:
    return Scheduler.restore(RULES, json.loads(json.dumps(sched.snapshot())), reference=reference)


@pytest.mark.parametrize("restored", [None, 2.5, 3.5])
@pytest.mark.parametrize("reference", [False, True])
def test_a_preemptor_starts_on_its_plan_after_a_gpu_came_back_on_a_node_of_it(reference, restored):
    sched = Scheduler(RULES, reference=reference)
    out = sched.handle([GpuHealthChanged(0.0, "n3", 1, False),
                        JobSubmitted(0.0, job("X", 2, "training", "c", 0, preemptible=False,
                                              runtime_estimate_s=1000.0))])
    assert _brief(out) == [("Start", "X", "n1:0,1")]
    out = sched.handle([JobSubmitted(0.0, job("V", 4, "sandbox", "c", 0, runtime_estimate_s=1000.0)),
                        JobSubmitted(0.0, job("W", 2, "sandbox", "c", 0, runtime_estimate_s=1000.0))])
    assert _brief(out) == [("Start", "V", "n2:0,1,2,3"), ("Start", "W", "n1:2,3")]
    out = sched.handle([JobSubmitted(2.0, job("P", 6, "batch", "a", 2, preemptible=False,
                                              runtime_estimate_s=100.0))])
    assert sorted(_brief(out)) == [("Preempt", "V", "P"), ("Preempt", "W", "P")]
    if restored == 2.5:
        sched = _restored(sched, reference)
    assert sched.handle([GpuHealthChanged(3.0, "n3", 1, True)]) == []
    if restored == 3.5:
        sched = _restored(sched, reference)
    assert sched.handle([JobSubmitted(4.0, job("Q", 4, "training", "b", 4, runtime_estimate_s=100.0))]) == []
    assert str(sched.pending_reason("P")) == "PreemptionInProgress(V,W)"
    assert str(sched.pending_reason("Q")) == "Resources"
    out = sched.handle([JobFinished(102.0, "V", ExitStatus.PREEMPTED), JobFinished(102.0, "W", ExitStatus.PREEMPTED)])
    assert _brief(out) == [("Start", "P", "n2:0,1,2,3 n3:0 n1:2")]
    # 2 GPUs free (n1:3, n3:1); X and P may not be preempted: that is what Q waits for
    assert str(sched.pending_reason("Q")) == "NoPreemptibleVictims(lower-priority jobs may not be preempted)"

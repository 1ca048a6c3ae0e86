"""A preemptor queued again keeps the GPU type it planned on (oracle seed 353597, issue 20
point 11 "restore == uninterrupted"; notes 038 and 071).

Under per-GPU-type quotas a pending job is bound to its base (every type) at rest, and a
preemptor to the type of its plan until its turn after the victims leave (note 038).
``Book.enqueue`` rests every job it queues. A node added (``lifecycle.node_added``) and a
spec amended (``amend.apply``) queue a pending preemptor again, so it lost its binding;
its next turn decided it on every type and bound it to the one closest to starting,
while its plan and hold stayed on the other. When its victims left, step 3 tried it on
the GPUs it held with a filter of the other type: refused, it let its hold go, and a job
ahead took the GPU. A restored core binds a preemptor to its plan's type (``restore_into``):
it started on its hold.

The case, by hand: n1 (A100, 1 GPU) and n2 (L40S, 1 GPU); cohort co of a (nominal: 0
A100, 1 L40S) and b (1 A100, 0 L40S); c is outside the cohort; sandbox's grace is 100 s.
V (c, sandbox) starts on n1 at 0. At 1 P (a, batch) evicts V (priority): its plan is
n1, an A100. At 2 W (b, research-training, L40S only) starts on n2: b borrows a's L40S.
At 3 Q (b, research-training, A100 only) waits behind P's hold (``Resources``). V leaves
at 101: P starts on n1 before anyone (step 3; Q, a higher class, may evict it once it
is old enough - not this test's matter). Before the fix, once P was queued again
at 2 (n2 added back) or 3 (its time limit changed), its turn bound it to L40S (a refusal
where it may reclaim a's lent L40S ranks first); at 101 it let n1 go, Q took it, and P
reclaimed W instead - while a core restored after 2 started P on n1.
"""

from __future__ import annotations

import json

import pytest
from builders import job, node, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.events import (GpuHealthChanged, JobFinished, JobSubmitted, JobUpdated, NodeAdded,
                                      NodeLost)
from gpushepherd.model.job import ExitStatus

RULES = policy(nodes=[node("n1", 1, "A100-80GB"), node("n2", 1, "L40S", gpu_mem_mib=46068)],
               teams={"a": {"nominal_gpus": {"A100-80GB": 0, "L40S": 1}},
                      "b": {"nominal_gpus": {"A100-80GB": 1, "L40S": 0}}, "c": {}},
               cohorts={"co": {"members": ["a", "b"]}},
               classes={"sandbox": {"grace_period_s": 100}})
N2 = next(n for n in RULES.nodes if n.name == "n2")


def _brief(out) -> list:
    return [(type(d).__name__, d.job_id, d.placement.parts if hasattr(d, "placement") else d.preemptor)
            for d in out]


def _restored(sched: Scheduler, reference: bool) -> Scheduler:
    return Scheduler.restore(RULES, json.loads(json.dumps(sched.snapshot())), reference=reference)


@pytest.mark.parametrize("restored", [None, 2.0, 3.0])
@pytest.mark.parametrize("requeued_by", ["node_added", "update"])
@pytest.mark.parametrize("reference", [False, True])
def test_a_preemptor_queued_again_starts_on_the_gpus_it_held(reference, requeued_by, restored):
    sched = Scheduler(RULES, reference=reference)
    # n2 out of service until 2: lost and added back, or its GPU unhealthy (no requeue)
    away = NodeLost(0.0, "n2") if requeued_by == "node_added" else GpuHealthChanged(0.0, "n2", 0, False)
    back = NodeAdded(2.0, N2) if requeued_by == "node_added" else GpuHealthChanged(2.0, "n2", 0, True)
    out = sched.handle([away, JobSubmitted(0.0, job("V", 1, "sandbox", "c", 0, runtime_estimate_s=1000.0))])
    assert _brief(out) == [("Start", "V", (("n1", (0,)),))]
    out = sched.handle([JobSubmitted(1.0, job("P", 1, "batch", "a", 1, runtime_estimate_s=500.0))])
    assert _brief(out) == [("Preempt", "V", "P")]
    out = sched.handle([back, JobSubmitted(2.0, job("W", 1, "research-training", "b", 2, gpu_types=("L40S",),
                                                    runtime_estimate_s=1000.0))])
    assert _brief(out) == [("Start", "W", (("n2", (0,)),))]
    if restored == 2.0:
        sched = _restored(sched, reference)
    three = [JobSubmitted(3.0, job("Q", 1, "research-training", "b", 3, gpu_types=("A100-80GB",),
                                   runtime_estimate_s=100.0))]
    if requeued_by == "update":
        three.append(JobUpdated(3.0, "P", time_limit_s=3000.0))
    assert sched.handle(three) == []
    assert str(sched.pending_reason("P")) == "PreemptionInProgress(V)"
    assert str(sched.pending_reason("Q")) == "Resources"
    if restored == 3.0:
        sched = _restored(sched, reference)
    out = sched.handle([JobFinished(101.0, "V", ExitStatus.PREEMPTED)])
    assert _brief(out) == [("Start", "P", (("n1", (0,)),))]

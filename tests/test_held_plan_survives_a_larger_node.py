"""A preemptor whose victims are gone starts on the GPUs its plan held, though a node
added since makes it fit one node (note 077; the case note 073 left open).

A job larger than any node is ``multi`` (``intake.shape_for``): whole free nodes, then one
remainder. A node added (``lifecycle.node_added``) derives every job's shape again, as a
job submitted now gets it: a node larger than the job turns a pending preemptor ``single``.
Its plan still spans the nodes of its victims. Step 3 of the pass places it within its plan
(``Admission.decide(within=plan)``); a ``single`` job needs one node with all its GPUs, so
the plan was refused, the hold let go, the victims (requeued ahead) restarted on the GPUs
their eviction had freed, and the preemptor waited: an eviction for nothing.

The case, by hand: n1, n2 and n3 have 4 GPUs; sandbox's grace is 100 s; a victim needs no
minimum runtime. At 0 X (training, 2 GPUs, not preemptible) starts on n1:0,1, Y
(training, 3 GPUs, not preemptible) on n2:0-2, V (sandbox, 4) on n3 and W (sandbox, 2) on
n1:2,3. At 2 P (batch, 6 GPUs, not preemptible) finds 1 GPU free and evicts V and W: its
plan is n3 4 (whole), n1 2 (the remainder, best fit of n1's 2 and n2's 1). At 3 n4 (8
GPUs) joins and Q (training, 4 GPUs) comes: Q takes n4:0-3; P now reads ``single`` and
no node has 6 GPUs free outside its hold: it keeps its hold (PreemptionInProgress). At 102
V and W are gone: P starts first on n3:0-3 and n1:2,3, as it held them, and V (back in the
queue) takes n4:4-7. Before the fix P let its hold go, V restarted on n3 and W on n1:2,3,
and P read Resources.

The reverse is right and stays: a plan whose GPUs are not all in service once the victims
are gone is let go and the job takes its turn as an ordinary one (its shape of now).
"""

from __future__ import annotations

import json

import pytest
from builders import job, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.cluster import Node
from gpushepherd.model.events import GpuHealthChanged, JobFinished, JobSubmitted, NodeAdded, NodeLost
from gpushepherd.model.job import ExitStatus

GRACE = {"sandbox": {"grace_period_s": 100}}
RULES = policy(nodes=[("n1", 4), ("n2", 4), ("n3", 4)], classes=GRACE, preemption={"enabled": True, "min_runtime_s": 0})
N4 = Node(name="n4", gpus=8, gpu_type="A100-80GB", gpu_mem_mib=81920)


def _brief(out) -> list:
    return [(type(d).__name__, d.job_id, str(d.placement) if hasattr(d, "placement") else getattr(d, "preemptor", None))
            for d in out]


def _restored(sched: Scheduler, rules, reference: bool) -> Scheduler:
    return Scheduler.restore(rules, json.loads(json.dumps(sched.snapshot())), reference=reference)


def _reason(sched: Scheduler, job_id: str) -> str:
    return str(sched.pending_reason(job_id))


def _p_evicts_v_and_w(reference: bool, restored: float | None) -> Scheduler:
    """To 3: P holds n3 and n1:2,3 for its plan; n4 has joined and Q runs on n4:0-3."""
    sched = Scheduler(RULES, reference=reference)
    out = sched.handle([JobSubmitted(0.0, job("X", 2, "training", "c", 0, preemptible=False, runtime_estimate_s=1000.0)),
                        JobSubmitted(0.0, job("Y", 3, "training", "c", 0, preemptible=False, runtime_estimate_s=1000.0))])
    assert _brief(out) == [("Start", "X", "n1:0,1"), ("Start", "Y", "n2:0,1,2")]
    out = sched.handle([JobSubmitted(0.0, job("V", 4, "sandbox", "c", 0, runtime_estimate_s=1000.0)),
                        JobSubmitted(0.0, job("W", 2, "sandbox", "c", 0, runtime_estimate_s=1000.0))])
    assert _brief(out) == [("Start", "V", "n3:0,1,2,3"), ("Start", "W", "n1:2,3")]
    out = sched.handle([JobSubmitted(2.0, job("P", 6, "batch", "a", 2, preemptible=False, runtime_estimate_s=100.0))])
    assert sorted(_brief(out)) == [("Preempt", "V", "P"), ("Preempt", "W", "P")]
    if restored == 2.5:
        sched = _restored(sched, RULES, reference)
    out = sched.handle([NodeAdded(3.0, N4), JobSubmitted(3.0, job("Q", 4, "training", "b", 3, runtime_estimate_s=1000.0))])
    assert _brief(out) == [("Start", "Q", "n4:0,1,2,3")]
    if restored == 3.5:
        sched = _restored(sched, RULES, reference)
    assert _reason(sched, "P") == "PreemptionInProgress(V,W)"
    return sched


@pytest.mark.parametrize("restored", [None, 2.5, 3.5])
@pytest.mark.parametrize("reference", [False, True])
def test_a_preemptor_starts_on_its_plan_after_a_node_it_fits_on_joined(reference, restored):
    sched = _p_evicts_v_and_w(reference, restored)
    out = sched.handle([JobFinished(102.0, "V", ExitStatus.PREEMPTED), JobFinished(102.0, "W", ExitStatus.PREEMPTED)])
    assert _brief(out) == [("Start", "P", "n3:0,1,2,3 n1:2,3"), ("Start", "V", "n4:4,5,6,7")]
    assert _reason(sched, "W") == "Resources"  # 1 GPU free (n2:3)


@pytest.mark.parametrize("reference", [False, True])
def test_a_plan_that_lost_a_gpu_is_let_go_though_a_node_joined(reference):
    """n1:2 (W's, held for P) fails at 4: W is stopped and requeued, P's hold no longer has
    every GPU it counted. At 102 V is gone: P lets its hold go and takes its turn as a
    ``single`` job (6 GPUs on one node: none has them, nothing of its class may be evicted
    for them), V restarts on n3."""
    sched = _p_evicts_v_and_w(reference, None)
    out = sched.handle([GpuHealthChanged(4.0, "n1", 2, False)])
    assert _brief(out) == [("Stop", "W", None), ("Start", "W", "n4:4,5")]
    assert _reason(sched, "P") == "PreemptionInProgress(V)"
    out = sched.handle([JobFinished(102.0, "V", ExitStatus.PREEMPTED)])
    assert _brief(out) == [("Start", "V", "n3:0,1,2,3")]
    assert "P" not in sched.book.preemptors and _reason(sched, "P") == "Resources"


@pytest.mark.parametrize("event", ["unhealthy", "lost"])
@pytest.mark.parametrize("reference", [False, True])
def test_a_single_node_plan_that_lost_a_gpu_is_let_go(reference, event):
    """n1 and n2 have 4 GPUs. X (not preemptible) on n1:0,1, V (sandbox) on n2, W
    (sandbox) on n1:2,3; P (4 GPUs) evicts V: its plan is n2 4. At 3 n2:0 fails (or n2 is
    lost): V goes with it, P's victims are gone, its plan lacks a GPU: its hold is let go
    and it waits as an ordinary job (no node can have 4 GPUs free for it)."""
    rules = policy(nodes=[("n1", 4), ("n2", 4)], classes=GRACE, preemption={"enabled": True, "min_runtime_s": 0})
    sched = Scheduler(rules, reference=reference)
    out = sched.handle([JobSubmitted(0.0, job("X", 2, "training", "c", 0, preemptible=False, runtime_estimate_s=1000.0)),
                        JobSubmitted(0.0, job("V", 4, "sandbox", "c", 0, runtime_estimate_s=1000.0)),
                        JobSubmitted(0.0, job("W", 2, "sandbox", "c", 0, runtime_estimate_s=1000.0))])
    assert _brief(out) == [("Start", "X", "n1:0,1"), ("Start", "V", "n2:0,1,2,3"), ("Start", "W", "n1:2,3")]
    out = sched.handle([JobSubmitted(2.0, job("P", 4, "batch", "a", 2, preemptible=False, runtime_estimate_s=100.0))])
    assert _brief(out) == [("Preempt", "V", "P")]
    out = sched.handle([GpuHealthChanged(3.0, "n2", 0, False) if event == "unhealthy" else NodeLost(3.0, "n2")])
    assert _brief(out) == [("Stop", "V", None)]
    assert "P" not in sched.book.preemptors and _reason(sched, "P") == "Resources"

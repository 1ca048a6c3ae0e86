"""A class's ``reserved_gpus`` keep from other classes at most the GPUs its pools hold
(design note 069; issue 20, points 12 and 4; oracle seed 335785, ``g_live``).

Before the fix (``326051d``) the core kept a class's whole ``reserved_gpus`` free as
whole GPUs anywhere, even GPUs of pools the class may not use. The hand-made case, on
both cores: n1 (3 A100-80GB, GPU 0 MIG-partitioned 4g.40gb + 3 x 1g.10gb, pool default),
n2 (1 A100-80GB, pool ``inf``); production-inference reserves 3 GPUs but may use pool
``inf`` alone (1 GPU), batch reserves 1; training is a strict FIFO queue, no backfill.
The core kept 3 + 1 of the 3 whole GPUs for them: a training fraction F waited
``ReservedFor(classes.production-inference.reserved_gpus)`` for ever (no fresh GPU is
ever left, and only a batch share could open a card F might join), the MIG job M behind
it ``Priority(F)`` for ever, and a whole-GPU job ``ExceedsCapacity`` on an idle cluster.
Now production-inference keeps 1 (the GPU of ``inf``), batch 1: F opens a GPU at 0, M
takes a 1g.10gb slice at 1, and W waits ``ReservedFor`` only while F holds a GPU.
"""

from __future__ import annotations

import json

import pytest
from builders import job, node, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.cluster import Node
from gpushepherd.model.decisions import Start
from gpushepherd.model.events import JobFinished, JobSubmitted, NodeAdded
from gpushepherd.model.job import ExitStatus, GpuShare

MIG = {"g0": {"layout": ["4g.40gb", "1g.10gb", "1g.10gb", "1g.10gb"]}}
CLASSES = {"production-inference": {"reserved_gpus": 3, "pools": ["inf"]},
           "batch": {"reserved_gpus": 1}, "training": {"queueing": "strict_fifo"}}
RULES = policy(nodes=[node("n1", 3, mig=MIG), node("n2", 1, pool="inf")], classes=CLASSES,
               backfill=False, mig={"reconfigure": True, "delay_s": 0})


def _started(decisions) -> dict[str, tuple]:
    return {d.job_id: (d.t, d.placement.parts, d.placement.share) for d in decisions if isinstance(d, Start)}


@pytest.mark.parametrize("reference", [False, True])
def test_a_reservation_beyond_the_class_pools_no_longer_keeps_a_strict_fifo_queue_waiting(reference):
    sched = Scheduler(RULES, reference=reference)
    f = job("F", 1, "training", "t", 0, share=GpuShare("fraction", milli=500), runtime_estimate_s=100.0)
    m = job("M", 1, "training", "t", 1, share=GpuShare("mig", profile="1g.10gb"), runtime_estimate_s=50.0)
    w = job("W", 1, "training", "t", 2, runtime_estimate_s=100.0)
    out = sched.handle([JobSubmitted(0.0, f)])
    # 326051d: F ReservedFor(classes.production-inference.reserved_gpus) for ever
    assert _started(out) == {"F": (0.0, (("n2", (0,)),), "fraction:0.5")}
    out = sched.handle([JobSubmitted(1.0, m)])
    # 326051d: M Priority(F) for ever
    assert _started(out) == {"M": (1.0, (("n1", (0,)),), "mig:1g.10gb@4")}
    out = sched.handle([JobSubmitted(2.0, w)])
    # 2 whole GPUs free, production-inference and batch keep 1 each: W waits for F's GPU
    # (326051d: ExceedsCapacity(classes.production-inference.reserved_gpus=3,...))
    assert out == [] and str(sched.pending_reason("W")) == "ReservedFor(classes.production-inference.reserved_gpus)"
    out = sched.handle([JobFinished(51.0, "M", ExitStatus.COMPLETED)])
    assert out == [] and str(sched.pending_reason("W")) == "ReservedFor(classes.production-inference.reserved_gpus)"
    out = sched.handle([JobFinished(100.0, "F", ExitStatus.COMPLETED)])
    assert _started(out) == {"W": (100.0, (("n2", (0,)),), "")}


ADD_RULES = policy(nodes=[("n1", 3), node("n2", 1, pool="inf")],
                   classes={"production-inference": {"reserved_gpus": 3, "pools": ["inf"]}}, backfill=False)


def _after_node_added(reference: bool) -> Scheduler:
    """A and B (training, 1 GPU each) start at 0 (production-inference keeps 1 of 4;
    326051d: 3, B waited ReservedFor); at 5 node n3 (1 GPU, pool inf) joins: it keeps 2."""
    sched = Scheduler(ADD_RULES, reference=reference)
    out = sched.handle([JobSubmitted(0.0, job(x, 1, "training", "t", 0, runtime_estimate_s=1000.0)) for x in "AB"])
    assert sorted(_started(out)) == ["A", "B"]
    n3 = Node(name="n3", gpus=1, gpu_type="A100-80GB", gpu_mem_mib=81920, pool="inf")
    assert sched.handle([NodeAdded(5.0, n3)]) == []
    return sched


@pytest.mark.parametrize("restored", [False, True])
@pytest.mark.parametrize("reference", [False, True])
def test_a_node_added_to_the_class_pools_widens_what_its_reservation_keeps(reference, restored):
    sched = _after_node_added(reference)
    if restored:
        sched = Scheduler.restore(ADD_RULES, json.loads(json.dumps(sched.snapshot())), reference=reference)
    # 3 GPUs free (n1's third, n2, n3): C leaves 2 for production-inference's reservation,
    # D would leave 1
    out = sched.handle([JobSubmitted(6.0, job(x, 1, "training", "t", 6, runtime_estimate_s=1000.0)) for x in "CD"])
    assert sorted(_started(out)) == ["C"]
    assert str(sched.pending_reason("D")) == "ReservedFor(classes.production-inference.reserved_gpus)"


def test_the_policy_summary_says_what_a_reservation_beyond_the_class_pools_keeps():
    from gpushepherd.cli.policy import summary
    lines = summary(RULES)
    assert "class production-inference: priority 400, never preempted, reserved 3 GPUs (keeps 1: its pools hold no " \
           "more), pools inf" in lines
    assert "class batch: priority 200, preemptible, reserved 1 GPU" in lines

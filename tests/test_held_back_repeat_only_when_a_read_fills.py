"""A reserved class's share joining a card after a job was held back (``Turn.held_back``)
asks for another pass only when its start raises a use of its class's reservation that a
refusal read below the reservation (note 074, "Narrowed"; ``again._fills_a_read``).

The case, by hand: n1 has 8 GPUs, training reserves 1, preemption is off, backfill depth
3. At 0 TW (training, 1 GPU, 1000 s) covers training's reservation, TC (training, a tenth
of a GPU) opens a card, B (batch, 5 GPUs) starts: one GPU is left free. At 1 R1
(production inference, 7 GPUs) does not fit and reserves n1 from 1000; R2 (1 GPU,
5000 s) would delay that claim: ``ReservedFor(R1)``, refused by the claims (held back).
At 5 come 300 training shares of 5/1000 GPU (100 s): 180 fill TC's card, the rest open
the free GPU as a second card (R2: ``NoFit``). TW holds training's reservation, and at
R1's start (1000) no share runs any more: no class-hold read and no class slack can
loosen, and the shares all start in at most two passes. Before the narrowing each
share's start on a card asked for another pass, and each repeat halted at the next
admitted share (note 070): 182 passes.
"""

from __future__ import annotations

import json

import pytest
from builders import job, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Start
from gpushepherd.model.events import JobSubmitted, Tick
from gpushepherd.model.job import GpuShare

K = 300


def _sub(t, jid, gpus, cls, est, **kw):
    return JobSubmitted(t, job(jid, gpus, cls, "t", t, runtime_estimate_s=est, **kw))


@pytest.mark.parametrize("reference", [False, True])
def test_shares_of_a_covered_class_start_in_a_bounded_number_of_passes(reference):
    rules = policy(nodes=[("n1", 8)], classes={"training": {"reserved_gpus": 1}}, preemption=False, backfill=3)
    sched = Scheduler(rules, reference=reference)
    out = sched.handle([_sub(0, "TW", 1, "training", 1000),
                        _sub(0, "TC", 1, "training", 1000, share=GpuShare("fraction", milli=100)),
                        _sub(0, "B", 5, "batch", 1000)])
    assert sorted(d.job_id for d in out if isinstance(d, Start)) == ["B", "TC", "TW"]
    assert sched.handle([_sub(1, "R1", 7, "production-inference", 100),
                         _sub(1, "R2", 1, "production-inference", 5000)]) == []
    assert str(sched.pending_reason("R1")) == "NoFit(whole-gpu)"
    assert str(sched.pending_reason("R2")) == "ReservedFor(R1)"
    before = sched.pass_no
    out = sched.handle([_sub(5, f"S{i:03d}", 1, "training", 100, share=GpuShare("fraction", milli=5))
                        for i in range(K)])
    assert [d.job_id for d in out] == [f"S{i:03d}" for i in range(K)]
    assert all(isinstance(d, Start) for d in out)
    assert sched.pass_no - before <= 2  # 182 before the narrowing
    assert str(sched.pending_reason("R2")) == "NoFit(whole-gpu)"  # the free GPU holds the second card
    restored = Scheduler.restore(rules, json.loads(json.dumps(sched.snapshot())), reference=reference)
    assert restored.handle([Tick(5.0)]) == []  # a full pass on the state left decides nothing more

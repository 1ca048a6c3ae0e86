"""After a job was refused at its turn by a class hold or the claims (``Turn.held_back``),
a share of a reserved class that joins a card asks for another pass only when it fills
some of its class's reservation that was read unfilled: by the class hold (its use now
below the reservation) or by a claim's class slack (``Profile.consume`` lowered the
claim's unfilled part; notes 074 and 078). Else it loosens nothing, and k such starts
took up to k + 1 passes (note 074, "Cost"). Both cores.

By hand: n1 has 8 GPUs; training reserves 1; preemption off; one reservation. At 0 T
(training, 1 GPU, 100 s) takes n1:0 and covers training's reservation, W (batch, 4 GPUs,
100 s) n1:1-4: n1:5-7 are free. At 0.5 Z (production inference, 6 GPUs) does not fit and
reserves n1 from 100; its slack there is 8 - 6 - 1 (training's reservation, T gone) = 1.
At 0.6 Y (production inference, 2 GPUs, 1000 s) is refused by the claims (it would take 2
of that slack), and again at 1, before 30 training shares of 0.1 (10 s) fill n1:5-7 as
three cards: 3 open a GPU, 27 join a card. T holds training's reservation, and every
share ends before Z's start: no read of it changes, and all start in the first pass or
its one repeat.
"""

from __future__ import annotations

import json

import pytest
from builders import job, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Start
from gpushepherd.model.events import JobSubmitted, Tick
from gpushepherd.model.job import GpuShare

K = 30


def _sub(t: float, jid: str, gpus: int, cls: str, est: float, **kw) -> JobSubmitted:
    return JobSubmitted(t, job(jid, gpus, cls, "t", t, runtime_estimate_s=est, **kw))


@pytest.mark.parametrize("reference", [False, True])
def test_card_joins_of_a_filled_class_after_a_refusal_take_at_most_two_passes(reference):
    rules = policy(nodes=[("n1", 8)], classes={"training": {"reserved_gpus": 1}}, preemption=False, backfill=1)
    sched = Scheduler(rules, reference=reference)
    sched.handle([_sub(0, "T", 1, "training", 100), _sub(0, "W", 4, "batch", 100)])
    assert sched.handle([_sub(0.5, "Z", 6, "production-inference", 100)]) == []
    assert sched.handle([_sub(0.6, "Y", 2, "production-inference", 1000)]) == []
    assert str(sched.pending_reason("Y")) == "ReservedFor(Z)"  # refused by the claims, in each pass before the shares
    before = sched.pass_no
    out = sched.handle([_sub(1, f"S{i:02d}", 1, "training", 10, share=GpuShare("fraction", milli=100))
                        for i in range(K)])
    starts = {d.job_id: d.placement.parts[0] for d in out if isinstance(d, Start)}
    assert sorted(starts) == [f"S{i:02d}" for i in range(K)]
    assert sorted(set(starts.values())) == [("n1", (5,)), ("n1", (6,)), ("n1", (7,))]
    assert str(sched.pending_reason("Y")) == "Resources"  # the cards took the free GPUs
    assert sched.pass_no - before <= 2  # 11 when each card join asked for a repeat (note 074)
    restored = Scheduler.restore(rules, json.loads(json.dumps(sched.snapshot())), reference=reference)
    assert restored.handle([Tick(1.0)]) == []

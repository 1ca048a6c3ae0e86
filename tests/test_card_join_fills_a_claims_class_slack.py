"""A share of a class with ``reserved_gpus`` that joins a card fills that class's
reservation for every claim whose class-hold slack counted it unfilled: a preemptor's
hold and a reservation that starts before the card comes free, as a whole-GPU start and
a MIG slice already did (``Profile.consume``; note 078, issue 20). Before, such a claim
kept the slack it read at the start of the pass: a later job was refused on it and waited
with a GPU free, while a core restored from the snapshot started it at the same instant.
Both cores; the decisions of the instant are those of a restored core's full pass.

Hold, by hand: n1 has 8 GPUs; training reserves 1. At 0 TC (training, 0.1) and BSa
(batch, 0.35) share n1:0, B (batch, 1 GPU) takes n1:1, BSb (batch, 0.6) n1:2, V (sandbox,
4 GPUs, grace 100) n1:3-6; n1:7 stays free for training's unfilled 0.9. At 1 P
(production inference, 4 GPUs) evicts V and holds n1:3-6; its slack is 1 free + 4 coming
- 4 held - 1 (training's 0.9, rounded up) = 0. At 2 J1a (training, 0.5) joins n1:0 and
J1b (training, 0.4) joins n1:2: training holds its reserved GPU, the hold's slack is 1,
and X (batch, 1 GPU, 10 s) starts on n1:7 behind Z's reservation (batch, 6 GPUs).

Reservation, by hand: n1 has 8 GPUs; training reserves 1; preemption off. At 0 TC
(training, 0.5, 1000 s) opens n1:0 and W (batch, 6 GPUs, 100 s) takes n1:1-6; n1:7 stays
free for training. At 1 Z (production inference, 6 GPUs) is refused and reserves 6 GPUs
of n1 from 100; its slack there is 7 free - 6 - 1 (training's 0.5) = 0. J1 (training, 0.5)
joins n1:0, which stays held until 1000: training holds its reserved GPU at 100 too, Z's
slack is 1, and X (batch, 1 GPU, 1000 s) starts on n1:7.
"""

from __future__ import annotations

import json

import pytest
from builders import job, node, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Start
from gpushepherd.model.events import JobSubmitted, Tick
from gpushepherd.model.job import GpuShare, JobState


def _sub(t: float, jid: str, gpus: int, cls: str, est: float = 1000, **kw) -> JobSubmitted:
    return JobSubmitted(t, job(jid, gpus, cls, "t", t, runtime_estimate_s=est, **kw))


def _starts(out) -> dict[str, tuple]:
    return {d.job_id: d.placement.parts for d in out if isinstance(d, Start)}


def _restored_decides_nothing(rules, sched: Scheduler, t: float, reference: bool) -> None:
    restored = Scheduler.restore(rules, json.loads(json.dumps(sched.snapshot())), reference=reference)
    assert restored.handle([Tick(t)]) == []
    assert sched.handle([Tick(t)]) == []  # a second pass of the uninterrupted core, too


@pytest.mark.parametrize("kind", ["fraction", "mps"])
@pytest.mark.parametrize("reference", [False, True])
def test_a_job_refused_on_a_holds_slack_read_before_a_card_join_filled_the_class_starts(reference, kind):
    def share(milli: int) -> GpuShare:
        return GpuShare(kind, milli=milli)

    rules = policy(nodes=[node("n1", 8, sharing={"mps": {"max_clients": 20}})],
                   classes={"training": {"reserved_gpus": 1}, "sandbox": {"grace_period_s": 100}},
                   preemption={"enabled": True, "min_runtime_s": 0}, backfill=1)
    sched = Scheduler(rules, reference=reference)
    # (id, GPUs, class, share milli or 0, preemptible or the class default): n1:0 TC+BSa, n1:1 B, n1:2 BSb, n1:3-6 V
    at_0 = [("TC", 1, "training", 100, None), ("BSa", 1, "batch", 350, False), ("BSb", 1, "batch", 600, False),
            ("B", 1, "batch", 0, False), ("V", 4, "sandbox", 0, None)]
    sched.handle([_sub(0, jid, gpus, cls, preemptible=pre, share=share(milli) if milli else None)
                  for jid, gpus, cls, milli, pre in at_0])
    sched.handle([_sub(1, "P", 4, "production-inference", preemptible=False)])
    assert sched.book.jobs["P"].victims == {"V"}
    out = sched.handle([_sub(2, "J1a", 1, "training", share=share(500)),
                        _sub(2, "J1b", 1, "training", share=share(400)),
                        _sub(1.5, "Z", 6, "batch"), _sub(2, "X", 1, "batch", est=10)])
    assert _starts(out) == {"J1a": (("n1", (0,)),), "J1b": (("n1", (2,)),), "X": (("n1", (7,)),)}
    assert sched.book.jobs["P"].victims == {"V"}  # the hold stands: V still leaves
    assert sched.book.jobs["Z"].state is JobState.PENDING
    _restored_decides_nothing(rules, sched, 2.0, reference)


@pytest.mark.parametrize("reference", [False, True])
def test_a_job_refused_on_a_reservations_slack_read_before_a_card_join_filled_the_class_starts(reference):
    rules = policy(nodes=[("n1", 8)], classes={"training": {"reserved_gpus": 1}}, preemption=False, backfill=1)
    sched = Scheduler(rules, reference=reference)
    sched.handle([_sub(0, "TC", 1, "training", share=GpuShare("fraction", milli=500)),
                  _sub(0, "W", 6, "batch", est=100)])
    out = sched.handle([_sub(1, "Z", 6, "production-inference"),
                        _sub(1, "J1", 1, "training", share=GpuShare("fraction", milli=500)),
                        _sub(1, "X", 1, "batch")])
    assert _starts(out) == {"J1": (("n1", (0,)),), "X": (("n1", (7,)),)}
    assert sched.book.jobs["Z"].state is JobState.PENDING
    _restored_decides_nothing(rules, sched, 1.0, reference)

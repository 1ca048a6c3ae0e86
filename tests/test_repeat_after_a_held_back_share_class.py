"""A reserved class's share that joins a card after a job was held back at its turn asks
for another pass, even when its class's use now reads at or above the reservation: the
hold that refused the job read the class's slack before other shares of the class filled
it earlier in the same pass (``Profile.consume`` leaves a hold's class slack as it was on
a card join; note 074, "Narrowed, then reverted"). A narrowing of that repeat
(``again._fills_a_read``, reverted) read the live use and dropped the repeat: X waited
with n1:7 free while a restored core started it at the same instant. Both cores.
"""

from __future__ import annotations

import json

import pytest
from builders import job, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Start
from gpushepherd.model.events import JobSubmitted, Tick
from gpushepherd.model.job import GpuShare


def _sub(t: float, jid: str, gpus: int, cls: str, est: float = 1000, **kw) -> JobSubmitted:
    return JobSubmitted(t, job(jid, gpus, cls, "t", t, runtime_estimate_s=est, **kw))


def _frac(milli: int) -> GpuShare:
    return GpuShare("fraction", milli=milli)


@pytest.mark.parametrize("reference", [False, True])
def test_a_job_held_back_by_a_hold_read_before_its_class_filled_starts_in_the_same_instant(reference):
    # n1 has 8 GPUs; training reserves 1. At 0: TC (training, 0.1) on a card, BSa/BSb
    # (batch shares 0.35, 0.6) on cards, B (batch, 1 GPU), V (sandbox, 4 GPUs). At 1 P
    # (production inference, 4 GPUs) evicts V (grace 100) and holds its GPUs; the hold's
    # slack counts training's unfilled 0.9 as a whole GPU. At 2 training shares J1a (0.5)
    # and J1b (0.4) join cards and fill training's reservation; X (batch, 1 GPU) is
    # refused on the hold's slack as read before them; J2 (training, 0.05, behind X) joins
    # a card. The repeat pass it asks lets X start on n1:7 at 2, as a full pass on the
    # final state (a restored core) does.
    rules = policy(nodes=[("n1", 8)], classes={"training": {"reserved_gpus": 1}, "sandbox": {"grace_period_s": 100}},
                   preemption={"enabled": True, "min_runtime_s": 0}, backfill=1)
    sched = Scheduler(rules, reference=reference)
    sched.handle([_sub(0, "TC", 1, "training", share=_frac(100)),
                  _sub(0, "BSa", 1, "batch", preemptible=False, share=_frac(350)),
                  _sub(0, "BSb", 1, "batch", preemptible=False, share=_frac(600)),
                  _sub(0, "B", 1, "batch", preemptible=False), _sub(0, "V", 4, "sandbox")])
    sched.handle([_sub(1, "P", 4, "production-inference", preemptible=False)])
    out = sched.handle([_sub(2, "J1a", 1, "training", share=_frac(500)),
                        _sub(2, "J1b", 1, "training", share=_frac(400)),
                        _sub(1.5, "Z", 6, "batch"), _sub(2, "X", 1, "batch", est=10),
                        _sub(2, "J2", 1, "training", nice=300000, share=_frac(50))])
    assert "X" in [d.job_id for d in out if isinstance(d, Start)]
    restored = Scheduler.restore(rules, json.loads(json.dumps(sched.snapshot())), reference=reference)
    assert restored.handle([Tick(2.0)]) == []

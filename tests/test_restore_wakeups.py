"""A restart keeps the wake-ups a pass asked for (design note 064, point 5; issue 20,
oracle seed 311299, ``f_restart``).

A pass asks for a wake-up when a job it started comes of age (``min_runtime_s``) as a
victim of a job it refused (``core/again.py``), and when a refused job's victims are too
young (``Turn.preempt``). Those times (``book.wakeups``) are not worked out from the state
again: a restored core without them sleeps to its next timer (here the priority
recalculation) and preempts later than the uninterrupted core. The hand-made case, on both
cores:

n1 has 2 GPUs; preemption ``min_runtime_s`` 10, batch's grace 0; priorities are
recalculated every 30 s. W (batch, 1 GPU) starts on GPU 0 at 0. At 1 come R
(research-training, 2 GPUs) and J (batch, 1 GPU, estimate 100), R ahead. R's turn: one GPU
free, W too young until 10 - evicting W would do: ``NoPreemptibleVictims(min_runtime:
victims eligible at t=10)``, a wake-up at 10 (``Turn.preempt``). J then starts on GPU 1
(ends at 101, before W's planned end 1000: no reservation delayed): a start R may evict once
it comes of age at 11 - a wake-up at 11 (``again.after_start``). At 10 evicting W alone no
longer does (J holds GPU 1): eligible at 11. At 11 R preempts J and W (grace 0) and starts
on both GPUs.

A scenario file cannot show it: the simulator keeps its own queue of ticks across a
``restart`` event (the tick at 10 was queued before the restart), and a restored core's
first pass is full, so it asks for 11 again at 10. A daemon restarted between 1 and 11 has
no such queue: its next tick is ``next_wakeup()`` of the restored core. Before the fix
(``993ecca``) that was the recalculation at 30, where R preempted J and W: 19 s late.
"""

from __future__ import annotations

import json

import pytest
from builders import job, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Preempt, Start
from gpushepherd.model.events import JobFinished, JobSubmitted, Tick
from gpushepherd.model.job import ExitStatus

RULES = policy(nodes=[("n1", 2)], classes={"batch": {"grace_period_s": 0}},
               preemption={"enabled": True, "min_runtime_s": 10.0},
               priority={"recalc_s": 30, "weights": {"age": 1000}})


def _until_started(sched: Scheduler, job_id: str, horizon: float = 100.0) -> list:
    """Drive ``sched`` as a daemon does with no other event: a ``Tick`` at each
    ``next_wakeup()`` (a preempted job's exit reported at once: grace 0), until
    ``job_id`` starts; returns every decision."""
    out: list = []
    while True:
        t = sched.next_wakeup()
        assert t is not None and t <= horizon, f"{job_id} never started; decisions {out}"
        got = sched.handle([Tick(t)])
        gone = [JobFinished(t, d.job_id, ExitStatus.PREEMPTED) for d in got if isinstance(d, Preempt)]
        if gone:
            got += sched.handle(gone)
        out += got
        if any(isinstance(d, Start) and d.job_id == job_id for d in got):
            return out


def _restored(sched: Scheduler, reference: bool) -> Scheduler:
    return Scheduler.restore(RULES, json.loads(json.dumps(sched.snapshot())), reference=reference)


def _at_one(reference: bool) -> Scheduler:
    sched = Scheduler(RULES, reference=reference)
    out = sched.handle([JobSubmitted(0.0, job("W", 1, "batch", "t", 0, runtime_estimate_s=1000.0))])
    assert [d.job_id for d in out] == ["W"]
    out = sched.handle([JobSubmitted(1.0, job("R", 2, "research-training", "t", 1, runtime_estimate_s=50.0)),
                        JobSubmitted(1.0, job("J", 1, "batch", "t", 1, runtime_estimate_s=100.0))])
    assert out == [Start(1.0, "J", out[0].placement)] and out[0].placement.parts == (("n1", (1,)),)
    assert str(sched.pending_reason("R")) == "NoPreemptibleVictims(min_runtime: victims eligible at t=10)"
    return sched


def _expected(reference: bool) -> list:
    """The uninterrupted core's decisions from 1 on: R preempts J and W at 11 and starts."""
    out = _until_started(_at_one(reference), "R")
    assert [(type(d).__name__, d.t, d.job_id) for d in out] == [
        ("Preempt", 11.0, "J"), ("Preempt", 11.0, "W"), ("Start", 11.0, "R")]
    assert all(d.preemptor == "R" for d in out if isinstance(d, Preempt))
    return out


@pytest.mark.parametrize("reference", [False, True])
def test_a_core_restored_after_the_pass_that_started_the_young_victim_preempts_when_it_comes_of_age(reference):
    # restored after the pass at 1: the wake-ups 10 (W comes of age) and 11 (J, which that
    # pass started after refusing R: again.py) are in the snapshot; 993ecca: next_wakeup()
    # was the recalculation at 30, and R preempted J and W there
    restored = _restored(_at_one(reference), reference)
    wake = restored.next_wakeup()
    assert _until_started(restored, "R") == _expected(reference)
    assert wake == 10.0


@pytest.mark.parametrize("reference", [False, True])
def test_a_core_restored_after_the_pass_at_the_first_wake_up_preempts_at_the_second(reference):
    # restored after the pass at 10 (R: eligible at 11, J still too young): 993ecca slept
    # to 30 as well
    sched = _at_one(reference)
    assert sched.next_wakeup() == 10.0
    assert sched.handle([Tick(10.0)]) == []
    assert str(sched.pending_reason("R")) == "NoPreemptibleVictims(min_runtime: victims eligible at t=11)"
    restored = _restored(sched, reference)
    wake = restored.next_wakeup()
    assert _until_started(restored, "R") == _expected(reference)
    assert wake == 11.0


def test_a_snapshot_keeps_only_the_wake_ups_still_ahead():
    # the snapshot's list is the times after now, sorted; a pass at 10 consumed 10
    sched = _at_one(False)
    assert sched.snapshot()["wakeups"] == [10.0, 11.0]
    sched.handle([Tick(10.0)])
    assert sched.snapshot()["wakeups"] == [11.0]

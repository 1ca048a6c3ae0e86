"""A core restored from its snapshot holds what the uninterrupted core holds, so that it
decides the same (issue 20 point 4, "incremental pass == full pass == restore"; design
note 049). Each test names a piece of state a restore used to derive otherwise - the
oracle's ``f_restart`` found each (seeds in ``test_oracle.FOUND``) - and compares it, and
the decisions that follow, between the two cores."""

from __future__ import annotations

import json

from builders import job, node, policy
from gpushepherd.core import typed
from gpushepherd.core.fairshare import UsageBook
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.cluster import Node
from gpushepherd.model.events import JobFinished, JobSubmitted, NodeAdded, Tick
from gpushepherd.model.job import GpuShare


def _restored(sched: Scheduler) -> Scheduler:
    return Scheduler.restore(sched.rules, json.loads(json.dumps(sched.snapshot())))


def _derived(sched: Scheduler) -> dict:
    return {j.id: (j.shape, j.units, j.charges) for j in sched.book.jobs.values() if not j.state.terminal}


def test_a_node_added_derives_every_job_as_a_restored_core_does():
    # seeds 183569, 148721: n1 has one 40 GiB card. R (3 GPUs) is larger than any node:
    # a multi-node job on n1 and n2. M (a memory share of 40 GiB) is charged the whole
    # card. A node with four 80 GiB cards comes: R would fit one node now (a single-node
    # job once requeued), M half of a card (the least it can be charged while pending) -
    # for the running job too, as a restored core derives them
    rules = policy(nodes=[node("n1", 2, gpu_type="A100-40GB", gpu_mem_mib=40960),
                          node("n2", 1, gpu_type="A100-40GB", gpu_mem_mib=40960)])
    sched = Scheduler(rules)
    sched.handle([JobSubmitted(0.0, job("R", 3, submit=0)),
                  JobSubmitted(0.0, job("M", 1, submit=0, share=GpuShare("fraction", mem_mib=40960)))])
    assert sched.book.jobs["R"].shape.mode == "multi" and sched.book.jobs["M"].units == 7000
    sched.handle([NodeAdded(10.0, node=Node("n9", 4, "A100-80GB", 81920))])
    assert sched.book.jobs["R"].shape.mode == "single" and sched.book.jobs["M"].units == 3500
    assert _derived(sched) == _derived(_restored(sched))


def test_usage_restored_decays_to_the_last_bit():
    # seed 122739: decayed from the snapshot's instant instead of from where it was kept,
    # a fair-share score differed in the 16th digit and two jobs swapped places
    live = UsageBook(604800.0, 7000)
    live.hold((("team", "a"),), 3.0, 7000)
    live.hold((("team", "a"),), 11.0, 3500)
    again = UsageBook(604800.0, 7000)
    again.restore(live.snapshot(17.0), 17.0)
    again.hold((("team", "a"),), 17.0, 10500)  # the running jobs, re-occupied
    again.settle(live.exact())
    assert again.entries == live.entries
    assert again.value(("team", "a"), 1e6) == live.value(("team", "a"), 1e6)


def test_a_share_preemptor_keeps_its_gpu_type_through_a_restore():
    # seeds 146120, 119107, 159257: per-type quotas (note 038). S (training, half a card)
    # preempts V on n1's L40S card, which K keeps: its plan names no node (it joins the
    # card), so a restore bound it to no type. W's A100 then comes free while V is still
    # leaving: S waits for the L40S card it planned on - restored, it started on the A100
    rules = policy(nodes=[node("n1", 1, gpu_type="L40S", gpu_mem_mib=46068), node("n2", 1, gpu_type="A100-80GB")],
                   teams={"t": {"max_gpus": {"L40S": 1, "A100-80GB": 1}}, "u": {}})
    sched = Scheduler(rules)
    sched.handle([JobSubmitted(0.0, job("W", 1, "production-inference", "u", 0, gpu_types=("A100-80GB",))),
                  JobSubmitted(0.0, job("V", 1, "sandbox", "u", 0, share=GpuShare("fraction", milli=500))),
                  JobSubmitted(0.0, job("K", 1, "research-training", "u", 0, share=GpuShare("fraction", milli=250)))])
    out = sched.handle([JobSubmitted(5.0, job("S", 1, "training", "t", 5, share=GpuShare("fraction", milli=500)))])
    assert [(type(d).__name__, d.job_id) for d in out] == [("Preempt", "V")]
    assert sched.book.jobs["S"].plan == [] and typed.bound_type(sched.book.jobs["S"]) == "L40S"
    restored = _restored(sched)
    assert typed.bound_type(restored.book.jobs["S"]) == "L40S"
    batch = [JobFinished(6.0, job_id="W")]
    assert restored.handle(batch) == sched.handle(batch) == []
    assert restored.handle([Tick(6.0)]) == []


def test_a_restore_keys_jobs_and_derives_charges_as_a_cold_full_make_job_does(monkeypatch):
    # note 062: a restore leaves make_job's queue key out (the snapshot holds it) and
    # starts from the last restore's memos of the rules (QuotaBook.applicable,
    # Book.cohort_of); every job restored must be what a cold restore with the key worked
    # out first makes of it, at every instant of oracle workloads (two rules in turn)
    from dataclasses import fields

    from oracle_checks import drive
    from oracle_workloads import workload_from_seed
    from gpushepherd.core import intake, snapshot
    from gpushepherd.core.state import Job

    def cold(rules, snap):
        with monkeypatch.context() as m:
            made = intake.make_job
            m.setattr(snapshot, "make_job", lambda book, spec, keyed=True: made(book, spec))
            m.setattr(snapshot, "_WARM", [None, {}, {}])
            return Scheduler.restore(rules, snap)

    def record(sched):
        return {j.id: tuple(getattr(j, f.name) for f in fields(Job)) for j in sched.book.jobs.values()}

    compared = 0
    wls = [workload_from_seed(s) for s in range(0, 24, 4)]
    for wl, other in zip(wls, wls[1:] + wls[:1]):
        _r, calls = drive(wl, restarts=False, record_reasons=False)
        a = Scheduler(wl.rules)
        for call in calls[:-1]:
            a.handle(call.batch)
            snap = json.loads(json.dumps(a.snapshot()))
            Scheduler.restore(other.rules, json.loads(json.dumps(Scheduler(other.rules).snapshot())))
            warm, want = Scheduler.restore(wl.rules, snap), cold(wl.rules, snap)
            assert record(warm) == record(want), f"t={a.now:g}"
            assert warm.handle([Tick(a.now)]) == want.handle([Tick(a.now)])
            compared += 1
    assert compared > 50

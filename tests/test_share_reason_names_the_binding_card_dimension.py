"""A share's ``NoFit`` reason claims something of the open cards of its kind on its
nodes, and the claim is true (issue 20 point 12, "reasons that lie"; notes 063, 076):

* ``NoFit(gpu-memory)``: a card would take the share but for memory - its compute, and
  its replica where the card counts replicas (time-slicing, MPS), fit (oracle seed
  371686: a time-sliced card with a replica free and its memory all declared);
* ``NoFit(time-slice-replica)`` / ``NoFit(mps-client)`` ("no free replica"): cards of its
  kind are open and every replica of them is taken; none open at all is capacity,
  ``Resources``;
* an MPS replica is a client and its part of the SMs: a client free on a card whose
  SMs are too few for the share is no free replica (``NoFit(mps-client)``).

Both cores; the reason comes from ``core/reasons.py`` for both.
"""

from __future__ import annotations

import pytest
from builders import job, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.events import JobSubmitted
from gpushepherd.model.job import GpuShare

from oracle_checks import check
from oracle_workloads import workload_from_seed

TS = {"fractions": False, "time_slicing": {"replicas": 4}}
MPS = {"fractions": False, "mps": {"max_clients": 4}}


def _node(sharing: dict) -> dict:
    return {"name": "n1", "gpus": 2, "gpu_type": "A100-40GB", "gpu_mem_mib": 40960, "sharing": sharing}


def _run(sharing: dict, reference: bool, *specs) -> Scheduler:
    sched = Scheduler(policy(nodes=[_node(sharing)], preemption=False), reference=reference)
    for t, spec in enumerate(specs):
        sched.handle([JobSubmitted(float(t), job(spec[0], 1, spec[1], "t", t, **spec[2]))])
    return sched


def _ts(mem: int) -> dict:
    return {"share": GpuShare("time_slice", mem_mib=mem)}


@pytest.mark.parametrize("reference", [False, True])
def test_a_time_slice_share_with_a_replica_free_and_no_memory_left_reads_gpu_memory(reference):
    # seed 371686 shrunk: W holds GPU 1 whole; A, B, C declare all of GPU 0's 40960 MiB on
    # 3 of its 4 replicas. J (8192 MiB) would take the free replica but for memory.
    sched = _run(TS, reference, ("W", "batch", {}), ("A", "batch", _ts(16384)), ("B", "batch", _ts(8192)),
                 ("C", "batch", _ts(16384)), ("J", "sandbox", _ts(8192)))
    assert [j.id for j in sched.pending_jobs()] == ["J"]
    assert str(sched.pending_reason("J")) == "NoFit(gpu-memory)"


@pytest.mark.parametrize("reference", [False, True])
def test_a_time_slice_share_with_every_replica_taken_reads_time_slice_replica(reference):
    sched = _run(TS, reference, ("W", "batch", {}), *[(f"A{i}", "batch", _ts(4096)) for i in range(4)],
                 ("J", "sandbox", _ts(4096)))
    assert [j.id for j in sched.pending_jobs()] == ["J"]
    assert str(sched.pending_reason("J")) == "NoFit(time-slice-replica)"


@pytest.mark.parametrize("kind", ["time_slice", "mps"])
@pytest.mark.parametrize("reference", [False, True])
def test_a_share_with_no_card_of_its_kind_open_reads_resources(reference, kind):
    # both GPUs held whole: no replica exists to be taken; the core read "no free
    # replica" (NoFit(time-slice-replica) / NoFit(mps-client)) before note 076
    share = {"share": GpuShare(kind, mem_mib=4096) if kind == "time_slice" else GpuShare("mps", milli=250)}
    sched = _run(TS if kind == "time_slice" else MPS, reference, ("W1", "batch", {}), ("W2", "batch", {}),
                 ("J", "sandbox", share))
    assert [j.id for j in sched.pending_jobs()] == ["J"]
    assert str(sched.pending_reason("J")) == "Resources"


@pytest.mark.parametrize("reference", [False, True])
def test_an_mps_share_with_a_client_free_and_too_few_sms_reads_mps_client(reference):
    # W holds GPU 1 whole; A takes 60% of GPU 0's SMs on one of its 4 clients. J asks
    # 60%: three clients are free, none with the SMs it asks
    sched = _run(MPS, reference, ("W", "batch", {}), ("A", "batch", {"share": GpuShare("mps", milli=600)}),
                 ("J", "sandbox", {"share": GpuShare("mps", milli=600)}))
    assert [j.id for j in sched.pending_jobs()] == ["J"]
    assert str(sched.pending_reason("J")) == "NoFit(mps-client)"


@pytest.mark.parametrize("reference", [False, True])
def test_an_mps_share_with_every_client_taken_reads_mps_client(reference):
    sched = _run(MPS, reference, ("W", "batch", {}),
                 *[(f"A{i}", "batch", {"share": GpuShare("mps", milli=100)}) for i in range(4)],
                 ("J", "sandbox", {"share": GpuShare("mps", milli=100)}))
    assert [j.id for j in sched.pending_jobs()] == ["J"]
    assert str(sched.pending_reason("J")) == "NoFit(mps-client)"


def test_the_oracle_reads_a_replica_free_and_memory_short_as_gpu_memory():
    # the oracle's claim for NoFit(gpu-memory) of a share asking no compute counted only
    # memory left, not a free replica with memory binding (seed 371686, j7 at 15 and 16)
    rep = check(workload_from_seed(371686))
    assert [f.text for f in rep.failures] == []


@pytest.mark.parametrize("detail,state,caught", [
    ("time-slice-replica", "none-open", "no time_slice card is open on its nodes"),
    ("time-slice-replica", "memory-short", "has the replicas it asks free"),
    ("gpu-memory", "none-open", "no time_slice card on its nodes has gpu-memory left"),
    ("mps-client", "mps-client-free", "has the replicas it asks free"),
])
def test_the_oracle_catches_a_share_reason_whose_claim_is_false(detail, state, caught):
    # the checks of note 076, on states built by hand: "no free replica" with no card
    # open, or with a replica free; NoFit(gpu-memory) with no card of its kind open
    from types import SimpleNamespace

    from gpushepherd.model.reasons import PendingReason, ReasonCode
    from oracle_checks import Checker, Report

    if state == "mps-client-free":  # J waits for memory beside A; a client with its 20% is free
        sched = _run(MPS, False, ("W", "batch", {}),
                     ("A", "batch", {"share": GpuShare("mps", milli=600, mem_mib=36864)}),
                     ("J", "sandbox", {"share": GpuShare("mps", milli=200, mem_mib=8192)}))
    elif state == "none-open":
        sched = _run(TS, False, ("W1", "batch", {}), ("W2", "batch", {}), ("J", "sandbox", _ts(4096)))
    else:
        sched = _run(TS, False, ("W", "batch", {}), ("A", "batch", _ts(16384)), ("B", "batch", _ts(8192)),
                     ("C", "batch", _ts(16384)), ("J", "sandbox", _ts(8192)))
    j = sched.book.jobs["J"]
    rep = Report()
    Checker(SimpleNamespace(rules=sched.rules), rep).named(
        sched, j, PendingReason(ReasonCode.NO_FIT, detail), sched.admission.decide(j, sched.profile_for(j)), None)
    assert [f.prop for f in rep.failures] == ["c_reason"] and caught in rep.failures[0].text
    # and the reason the core gives there passes
    rep = Report()
    Checker(SimpleNamespace(rules=sched.rules), rep).named(
        sched, j, sched.pending_reason("J"), sched.admission.decide(j, sched.profile_for(j)), None)
    assert rep.failures == []

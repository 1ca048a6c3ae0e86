"""A share charged by the node it lands on is judged by the hard limits on that charge
before its strict FIFO queue's order (admission rule 2 before rule 4; oracle seed
367237, issue 20 point 12 "reasons that lie"; note 075, scenario I20-48). Both cores,
uninterrupted and restored.

The case, by hand (MPS): m1 has one 40 GB GPU with MPS max_clients 4, m2 two with
max_clients 2; team T may hold 2 GPUs; training is one strict FIFO queue. A (4 replicas,
no SM percentage) fills m1's card: 1 GPU. B (1 replica at 60%) opens m2 GPU 0: T at 1.6.
H (training, 1 GPU) is over T's limit: QuotaExceeded, the head of its queue. C (training,
1 replica, no SM percentage) is 1/4 GPU at its least (on m1) - within the limit - but the
only place left is a fresh m2 GPU, where it is 1/2: over the limit. With H gone it is
still refused by the limit; with the limit raised, still by H: the limit is the first
rule, and its reason. The memory-only fraction (charged its memory over the card's) is
the same class: 30 GB is 3/8 of the 80 GB card (m1, full) and 3/4 of a fresh 40 GB one.
"""

from __future__ import annotations

import json

import pytest
from builders import job, node, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Start
from gpushepherd.model.events import JobCancelled, JobFinished, JobSubmitted
from gpushepherd.model.job import GpuShare

QUOTA = "QuotaExceeded(teams.T.max_gpus=2, in use 1.6)"


def _mps_case():
    rules = policy(nodes=[node("m1", 1, "A100-40GB", 40960, sharing={"mps": {"max_clients": 4}}),
                          node("m2", 2, "A100-40GB", 40960, sharing={"mps": {"max_clients": 2}})],
                   teams={"T": {"max_gpus": 2}}, classes={"training": {"queueing": "strict_fifo"}},
                   preemption=False)
    first = [job("A", 1, "batch", "T", 0, share=GpuShare("mps", slots=4), runtime_estimate_s=100),
             job("B", 1, "batch", "T", 1, share=GpuShare("mps", milli=600), runtime_estimate_s=200)]
    return rules, first


def _fraction_case():
    # m1: one 80 GB GPU that F (team U) holds whole; m2: two 40 GB GPUs; B takes half of
    # m2 GPU 0 (T at 0.5 of its 1), H (1 GPU) is over the limit; C asks 30 GB: 3/8 GPU at
    # its least (the 80 GB card), 3/4 on m2 GPU 1 - over the limit
    rules = policy(nodes=[node("m1", 1, "A100-80GB", 81920), node("m2", 2, "A100-40GB", 40960)],
                   teams={"T": {"max_gpus": 1}, "U": {}}, classes={"training": {"queueing": "strict_fifo"}},
                   preemption=False)
    first = [job("F", 1, "batch", "U", 0, gpu_types=("A100-80GB",), runtime_estimate_s=100),
             job("B", 1, "batch", "T", 1, share=GpuShare("fraction", milli=500), runtime_estimate_s=200)]
    return rules, first


CASES = {
    "mps": (_mps_case, GpuShare("mps"), QUOTA),
    "memory-fraction": (_fraction_case, GpuShare("fraction", mem_mib=30720),
                        "QuotaExceeded(teams.T.max_gpus=1, in use 0.5)"),
}


def _started(out) -> list[str]:
    return [d.job_id for d in out if isinstance(d, Start)]


def _setup(case: str, reference: bool, restored: bool, share: GpuShare | None = None):
    build, default, reason = CASES[case]
    rules, first = build()
    sched = Scheduler(rules, reference=reference)
    out = []
    for spec in first:
        out += sched.handle([JobSubmitted(spec.submit_time, spec)])
    assert sorted(_started(out)) == sorted(s.id for s in first)
    out = sched.handle([JobSubmitted(2.0, job("H", 1, "training", "T", 2, runtime_estimate_s=300))])
    out += sched.handle([JobSubmitted(3.0, job("C", 1, "training", "T", 3, share=share or default,
                                               runtime_estimate_s=50))])
    assert _started(out) == []
    if restored:
        sched = Scheduler.restore(rules, json.loads(json.dumps(sched.snapshot())), reference=reference)
    return sched, reason


@pytest.mark.parametrize("restored", [False, True])
@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_share_behind_a_strict_head_reads_the_limit_its_spot_exceeds(case, reference, restored):
    sched, reason = _setup(case, reference, restored)
    assert str(sched.pending_reason("H")) == reason
    assert str(sched.pending_reason("C")) == reason  # not Priority(H)
    # the reason is the real blocker: with H gone, C is still refused by the limit
    assert sched.handle([JobCancelled(4.0, "H")]) == []
    assert str(sched.pending_reason("C")) == reason
    # and once B's quota comes back, C starts on m2
    out = sched.handle([JobFinished(201.0, "B")])
    assert "C" in _started(out)


@pytest.mark.parametrize("reference", [False, True])
def test_a_share_charged_the_same_everywhere_still_waits_for_its_head(reference):
    # C asks 25% explicitly: 1/4 GPU on m2's card, within T's limit - only H holds it back
    sched, _reason = _setup("mps", reference, False, GpuShare("mps", milli=250))
    assert str(sched.pending_reason("C")) == "Priority(H)"
    out = sched.handle([JobFinished(100.0, "A")])
    assert _started(out) == ["H", "C"]

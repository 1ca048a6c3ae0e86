"""A share preemptor joins the card its plan chose, also when a whole-GPU preemptor's
victim is the last other holder there (oracle seed 515380; scenario I20-57).

With classes' ``reserved_gpus`` a whole-GPU preemptor's hold keeps shares off every card
its victims free whole (design note 054). The hold is rebuilt at each pass from the
victims still there: once a share preemptor's own victim had left a card, the other
preemptor's victim was its last holder, the card counted as freed whole by that hold, and
the share preemptor - whose victim was gone - was refused ``HeldForPreemptor`` at its
turn, lost its hold, and waited for a card its plan had been given first. A hold now
never claims a card another preemptor, a share, plans to join (``Job.hold_gpus`` of a
share names it). Both cores; the oracle's workloads of this shape too."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import job, node, policy, policy_dict
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Preempt, Start
from gpushepherd.model.events import JobFinished, JobSubmitted, Tick
from gpushepherd.model.job import ExitStatus, GpuShare
from oracle_hypothesis import PROFILE, assert_clean
from oracle_workloads import Workload

TS = GpuShare("time_slice", mem_mib=4096, slots=1)


def _rules():
    """n1: 3 whole GPUs; n2: one card of 2 time-slice replicas. Production inference
    reserves a GPU; teams a (nominal 0: it borrows) and b (2) share a cohort of 2
    GPUs; team c is in none."""
    return policy(nodes=[("n1", 3), node("n2", 1, sharing={"time_slicing": {"replicas": 2}})],
                  teams={"a": {"nominal_gpus": 0}, "b": {"nominal_gpus": 2}, "c": {}},
                  cohorts={"co": {"members": ["a", "b"], "reclaim": "never"}},
                  classes={"production-inference": {"reserved_gpus": 1}, "sandbox": {"grace_period_s": 7.0}},
                  preemption={"enabled": True, "min_runtime_s": 0.0})


def _by_kind(out, kind) -> list[str]:
    return sorted(d.job_id for d in out if isinstance(d, kind))


@pytest.mark.parametrize("reference", [False, True])
def test_a_share_preemptor_joins_its_card_when_its_victim_is_gone(reference):
    s = Scheduler(_rules(), reference=reference)
    out = s.handle([JobSubmitted(0, job("v2", 1, "sandbox", "a", share=TS))])
    out += s.handle([JobSubmitted(1, job("v1", 1, "sandbox", "c", 1, share=TS))])
    assert _by_kind(out, Start) == ["v1", "v2"]  # the card is full; v1 is the younger
    # S (c, batch) evicts v1 for its replica; W (b, 2 GPUs on n1) evicts v2 for the
    # cohort (v2's 0.5 + 2 > 2); v1 leaves at 12, v2 at 14
    out = s.handle([JobSubmitted(5, job("S", 1, "batch", "c", 5, share=TS))])
    assert _by_kind(out, Preempt) == ["v1"]
    out = s.handle([JobSubmitted(7, job("W", 2, "batch", "b", 7))])
    assert _by_kind(out, Preempt) == ["v2"]
    out = s.handle([JobFinished(12, "v1", ExitStatus.PREEMPTED)])
    # S's victim is gone: it takes v1's replica beside v2 (before, W's hold kept the card
    # - v2 was its last other holder - and S waited HeldForPreemptor(W) until 14)
    assert _by_kind(out, Start) == ["S"]
    restored = Scheduler.restore(s.rules, json.loads(json.dumps(s.snapshot())), reference=reference)
    assert restored.handle([Tick(12)]) == []
    out = s.handle([JobFinished(14, "v2", ExitStatus.PREEMPTED)])
    # W on n1; v1, requeued, takes the replica v2 left beside S
    assert {d.job_id: d.placement.parts[0][0] for d in out if isinstance(d, Start)} == {"W": "n1", "v1": "n2"}


@st.composite
def two_preemptors_one_card(draw) -> Workload:
    """The shape of seed 515380, drawn: whole GPUs on n1, a card of 2-3 time-slice
    replicas on n2 (or two cards); a reserved GPU; a cohort member (a) that borrows with
    sandbox shares. Shares of a, then of c (outside the cohort, the younger) fill the
    card; share preemptors (batch, c) and whole-GPU preemptors (batch, b) arrive in a
    drawn order and at drawn gaps while the victims' grace periods run."""
    replicas = draw(st.integers(2, 3))
    raw = policy_dict(nodes=[node("n1", draw(st.integers(2, 4))),
                             node("n2", draw(st.integers(1, 2)), sharing={"time_slicing": {"replicas": replicas}})],
                      teams={"a": {"nominal_gpus": 0}, "b": {"nominal_gpus": draw(st.integers(1, 2))}, "c": {}},
                      cohorts={"co": {"members": ["a", "b"], "reclaim": draw(st.sampled_from(["never", "any"]))}},
                      classes={"production-inference": {"reserved_gpus": 1},
                               "sandbox": {"grace_period_s": draw(st.sampled_from([5.0, 7.0]))}},
                      preemption={"enabled": True, "min_runtime_s": 0.0})
    n_a = draw(st.integers(1, replicas - 1))
    jobs = [(job(f"v{i}", 1, "sandbox", "a" if i < n_a else "c", float(i), share=TS),
             draw(st.sampled_from([40.0, 1000.0]))) for i in range(replicas)]
    t = float(replicas)
    for i, kind in enumerate(draw(st.permutations(["s", "w"] + draw(st.lists(st.sampled_from("sw"), max_size=2))))):
        t += draw(st.sampled_from([1.0, 2.0, 3.0]))
        spec = (job(f"s{i}", 1, "batch", "c", t, share=TS) if kind == "s"
                else job(f"w{i}", draw(st.integers(1, 2)), "batch", "b", t))
        jobs.append((spec, draw(st.sampled_from([20.0, 500.0]))))
    return Workload(raw, jobs, [])


@settings(max_examples=60, **PROFILE)
@given(two_preemptors_one_card())
def test_share_and_whole_gpu_preemptors_on_one_card_pass_the_oracle(wl):
    assert_clean(wl)

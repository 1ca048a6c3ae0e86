"""A preemption plan reads rule 8 (other classes' ``reserved_gpus`` left free) at its
victims' exit as well as now (design note 090; oracle seed 515973; scenario I20-58).

A job of a reserved class planned to end before the victims leave covers its class's
reservation now but not when the preemptor is to start. Where it ran on a MIG instance,
its GPU does not come back whole, so the preemptor, admitted by the plan, was refused at
its start, its hold dropped and its victims' work lost. The plan now also reads the
reservation with such jobs gone (what they free whole counted free). Both cores, a
restore at the start, and the oracle's workloads of this shape."""

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

MIG7 = GpuShare("mig", profile="7g.80gb")


def _rules(**classes):
    """n1: 3 GPUs, GPU 0 one MIG 7g.80gb instance; n2: 1 GPU. Production inference
    reserves a GPU; sandbox's grace is 100 s."""
    return policy(nodes=[node("n1", 3, mig={"g0": {"layout": ["7g.80gb"]}}), ("n2", 1)],
                  classes={"production-inference": {"reserved_gpus": 1}, "sandbox": {"grace_period_s": 100.0},
                           **classes},
                  preemption={"enabled": True, "min_runtime_s": 0.0})


def _starts(out) -> dict[str, str]:
    return {d.job_id: d.placement.parts[0][0] for d in out if isinstance(d, Start)}


@pytest.mark.parametrize("reference", [False, True])
def test_a_preemptor_evicts_what_the_reservation_needs_at_its_victims_exit(reference):
    s = Scheduler(_rules(), reference=reference)
    out = s.handle([JobSubmitted(0, job("I", 1, "production-inference", "a", share=MIG7, time_limit_s=100.0))])
    assert _starts(out) == {"I": "n1"}
    out = s.handle([JobSubmitted(1, job(f"v{i}", 1, "sandbox", "a", 1)) for i in (1, 2, 3)])
    assert sorted(_starts(out)) == ["v1", "v2", "v3"]
    # at 10 I covers the reservation, but it ends at 100, before the victims leave (110):
    # then only n2's GPU may be the reserved one, so T (2 GPUs, n1) evicts v3 too
    out = s.handle([JobSubmitted(10, job("T", 2, "training", "a", 10))])
    assert sorted(d.job_id for d in out if isinstance(d, Preempt)) == ["v1", "v2", "v3"]
    s.handle([JobFinished(100, "I", ExitStatus.COMPLETED)])
    out = s.handle([JobFinished(110, v, ExitStatus.PREEMPTED) for v in ("v1", "v2", "v3")])
    assert _starts(out) == {"T": "n1"}  # before: refused ReservedFor, its hold dropped
    assert not any(isinstance(d, Preempt) for d in out)
    restored = Scheduler.restore(s.rules, json.loads(json.dumps(s.snapshot())), reference=reference)
    assert restored.handle([Tick(110)]) == []


@pytest.mark.parametrize("reference", [False, True])
def test_a_reserved_job_ending_before_the_exit_on_a_whole_gpu_costs_no_extra_victim(reference):
    # the same with I on n2's whole GPU: at 110 that GPU is free and covers the
    # reservation, so T evicts v1 and v2 only, as it did before
    s = Scheduler(policy(nodes=[("n1", 2), ("n2", 1)],
                         classes={"production-inference": {"reserved_gpus": 1}, "sandbox": {"grace_period_s": 100.0}},
                         preemption={"enabled": True, "min_runtime_s": 0.0}), reference=reference)
    out = s.handle([JobSubmitted(0, job("I", 1, "production-inference", "a", time_limit_s=100.0))])
    out += s.handle([JobSubmitted(1, job(f"v{i}", 1, "sandbox", "a", 1)) for i in (1, 2)])
    assert _starts(out) == {"I": "n2", "v1": "n1", "v2": "n1"}
    out = s.handle([JobSubmitted(10, job("T", 2, "training", "a", 10))])
    assert sorted(d.job_id for d in out if isinstance(d, Preempt)) == ["v1", "v2"]
    s.handle([JobFinished(100, "I", ExitStatus.COMPLETED)])
    out = s.handle([JobFinished(110, v, ExitStatus.PREEMPTED) for v in ("v1", "v2")])
    assert _starts(out) == {"T": "n1"}


@pytest.mark.parametrize("reference", [False, True])
def test_a_reserved_job_past_its_estimate_still_covers_the_reservation_at_the_exit(reference):
    # M (production inference, MIG, estimate 20 s, no time limit) runs on past its
    # estimate: nothing says it ends, so at T's victims' exit it still covers the
    # reservation. Found by the review of note 090: its first version counted M as gone
    # at every exit (its planned end lies in the past) and T waited ReservedFor until M ended
    s = Scheduler(_rules(), reference=reference)
    s.handle([JobSubmitted(0, job("M", 1, "production-inference", "a", share=MIG7, runtime_estimate_s=20.0))])
    out = s.handle([JobSubmitted(1, job("X", 1, "training", "a", 1))] +
                   [JobSubmitted(1, job(f"v{i}", 1, "sandbox", "a", 1)) for i in (1, 2)])
    assert _starts(out) == {"X": "n2", "v1": "n1", "v2": "n1"}
    out = s.handle([JobSubmitted(100, job("T", 2, "training", "a", 100))])
    assert sorted(d.job_id for d in out if isinstance(d, Preempt)) == ["v1", "v2"]
    out = s.handle([JobFinished(200, v, ExitStatus.PREEMPTED) for v in ("v1", "v2")])
    assert _starts(out) == {"T": "n1"}


@st.composite
def reserved_jobs_ending_before_the_exit(draw) -> Workload:
    """The shape of seed 515973, drawn: n1 with 1-2 MIG GPUs and 2-3 whole ones, n2 with
    1-2; a reserved class (production inference, 1-2 GPUs) whose jobs - mostly MIG
    instances, some whole GPUs - have time limits that end around the victims' exit, or
    estimates they may outrun; sandbox jobs (a drawn grace; some end on their own) on
    every whole GPU they may take; training and batch
    preemptors of 1-3 GPUs arriving while they run."""
    mig = draw(st.integers(1, 2))
    whole = (draw(st.integers(2, 3)), draw(st.integers(1, 2)))
    layout = {f"g{g}": {"layout": ["7g.80gb"] if draw(st.booleans()) else ["4g.40gb", "3g.40gb"]}
              for g in range(mig)}
    grace = draw(st.sampled_from([30.0, 100.0]))
    raw = policy_dict(nodes=[node("n1", mig + whole[0], mig=layout), node("n2", whole[1])],
                      classes={"production-inference": {"reserved_gpus": draw(st.integers(1, 2))},
                               "sandbox": {"grace_period_s": grace}},
                      preemption={"enabled": True, "min_runtime_s": 0.0})
    jobs = []
    for i in range(draw(st.integers(1, 2))):
        limit = draw(st.sampled_from([20.0, 50.0, 100.0, 150.0]))
        share = GpuShare("mig", profile=draw(st.sampled_from(["7g.80gb", "4g.40gb", "3g.40gb"]))) \
            if draw(st.integers(0, 3)) else None
        if draw(st.integers(0, 2)):  # a time limit, or an estimate it may outrun
            jobs.append((job(f"i{i}", 1, "production-inference", "a", float(i), share=share, time_limit_s=limit),
                         draw(st.sampled_from([limit, limit / 2]))))
        else:
            jobs.append((job(f"i{i}", 1, "production-inference", "a", float(i), share=share,
                             runtime_estimate_s=limit), draw(st.sampled_from([limit / 2, limit * 3]))))
    for i in range(sum(whole)):
        jobs.append((job(f"v{i}", 1, "sandbox", "a", 2.0 + i), draw(st.sampled_from([1000.0, 1000.0, 60.0]))))
    t = 10.0
    for i in range(draw(st.integers(1, 3))):
        t += draw(st.sampled_from([1.0, 20.0, 60.0]))
        jobs.append((job(f"p{i}", draw(st.integers(1, 3)), draw(st.sampled_from(["training", "batch"])), "a", t),
                     draw(st.sampled_from([50.0, 500.0]))))
    return Workload(raw, jobs, [])


@settings(max_examples=60, **PROFILE)
@given(reserved_jobs_ending_before_the_exit())
def test_reserved_jobs_ending_before_their_preemptors_victims_leave_pass_the_oracle(wl):
    assert_clean(wl)

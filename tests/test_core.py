"""Unit tests of the scheduling core with hand-computed outcomes.

Each test builds a tiny cluster with the builders, feeds ``Scheduler.handle`` a few
events and states exactly which decisions, placements, states and reasons follow
(worked out by hand from the rules in core/placement.py, core/preemption.py and
core/backfill.py).
"""

from __future__ import annotations

import json

import pytest

from builders import job, placed, policy, scheduler, simulate, submit
from gpushepherd.core.scheduler import Scheduler, SpecError
from gpushepherd.model.decisions import Preempt, Reject, Start, Stop
from gpushepherd.model.events import (
    GpuHealthChanged,
    JobAdopted,
    JobCancelled,
    JobFinished,
    JobRequeueRequested,
    JobSubmitted,
    NodeAdded,
    NodeLost,
    Tick,
)
from gpushepherd.model.job import ExitStatus, JobState
from gpushepherd.model.placement import Placement
from gpushepherd.model.reasons import ReasonCode

R = ReasonCode


def starts(decisions) -> dict[str, dict[str, tuple[int, ...]]]:
    return {d.job_id: placed(d) for d in decisions if isinstance(d, Start)}


def reason(sched: Scheduler, job_id: str) -> tuple[ReasonCode, str]:
    r = sched.pending_reason(job_id)
    assert r is not None, f"{job_id} is not pending"
    return r.code, r.detail


def done(t: float, job_id: str, status: ExitStatus = ExitStatus.COMPLETED) -> JobFinished:
    return JobFinished(t, job_id, status)


# ------------------------------------------------------------------ placement
def test_single_node_jobs_go_to_the_tightest_node_that_fits():
    # a: 6 -> n1 (n1 and n3 tie at 8 free: lowest index); b: 2 -> n1 (2 free, the
    # tightest); c: 3 -> n2 (4 free beats n3's 8); d: 1 -> n2's last GPU.
    rules = policy(nodes=[("n1", 8), ("n2", 4), ("n3", 8)])
    sched, out = scheduler(rules, job("a", 6), job("b", 2), job("c", 3), job("d", 1))
    assert [d.job_id for d in out] == ["a", "b", "c", "d"]
    assert starts(out) == {
        "a": {"n1": (0, 1, 2, 3, 4, 5)},
        "b": {"n1": (6, 7)},
        "c": {"n2": (0, 1, 2)},
        "d": {"n2": (3,)},
    }
    assert sched.ledger.free_total == 8  # n3 untouched
    sched.check_invariants()


def test_a_gang_larger_than_a_node_takes_whole_nodes_and_the_tightest_remainder():
    # x: 3 -> n1. y: 12 GPUs on 8-GPU nodes: whole free nodes first (n2; n3 would
    # overshoot), then the 4-GPU remainder on the tightest node that fits: n1 (5 free)
    # rather than n3 (8 free).
    rules = policy(nodes=[("n1", 8), ("n2", 8), ("n3", 8)])
    sched, out = scheduler(rules, job("x", 3), job("y", 12))
    y = next(d for d in out if d.job_id == "y")
    assert y.placement.parts == (("n2", tuple(range(8))), ("n1", (3, 4, 5, 6)))
    assert sched.ledger.slots[sched.ledger.by_name["n3"]].free == 8


def adopt(t: float, spec, **parts) -> JobAdopted:
    """``spec`` found running on ``parts`` (``n1=(0, 1)``): pins a job where a test wants it."""
    return JobAdopted(t, spec=spec, placement=Placement(tuple((n, tuple(g)) for n, g in parts.items())))


def test_a_multi_node_gang_waits_for_a_whole_node():
    # One GPU busy on each 8-GPU node: 21 GPUs free but no whole node, so 12 GPUs do
    # not fit (NoFit, whole-nodes). Once n2 is whole: n2 + 4 on the tightest other node
    # (n1 and n3 both have 7 free: lowest index).
    rules = policy(nodes=[("n1", 8), ("n2", 8), ("n3", 8)], preemption=False)
    sched = Scheduler(rules)
    sched.handle([adopt(0, job("x1", 1), n1=(0,)), adopt(0, job("x2", 1), n2=(0,)),
                  adopt(0, job("x3", 1), n3=(0,))])
    assert sched.handle(submit(job("big", 12, submit=1))) == []
    assert reason(sched, "big") == (R.NO_FIT, "whole-nodes")
    out = sched.handle([done(2, "x2")])
    assert [d.placement.parts for d in out] == [(("n2", tuple(range(8))), ("n1", (1, 2, 3, 4)))]
    sched.check_invariants()


def test_pods_of_a_gang_are_packed_node_by_node():
    # x: 1 -> n1. 3 pods x 2 GPUs: pod 1 -> n1 (3 free, tightest), pod 2 -> n2 (n1
    # has 1 left), pod 3 -> n2 (2 left, tightest).
    rules = policy(nodes=[("n1", 4), ("n2", 4)])
    sched, _ = scheduler(rules, job("x", 1))
    out = sched.handle(submit(job("g", 6, gpus_per_pod=2, submit=1)))
    assert starts(out) == {"g": {"n1": (1, 2), "n2": (0, 1, 2, 3)}}
    # on empty nodes the same gang fills n1 first: pods 1, 2 -> n1, pod 3 -> n2
    _, out = scheduler(rules, job("g", 6, gpus_per_pod=2))
    assert starts(out) == {"g": {"n1": (0, 1, 2, 3), "n2": (0, 1)}}


def test_pods_never_split_across_nodes():
    # 2 pods x 3 GPUs with 2 GPUs free on each of three 4-GPU nodes: 6 free, but no
    # node has 3 free (NoFit, pods). With n1 whole only one pod fits; with n1 and n2
    # whole, pod 1 -> n1 (tie: lowest index), pod 2 -> n2.
    rules = policy(nodes=[("n1", 4), ("n2", 4), ("n3", 4)], preemption=False)
    sched = Scheduler(rules)
    sched.handle([adopt(0, job(f"x{i}", 2), **{f"n{i}": (0, 1)}) for i in (1, 2, 3)])
    assert sched.handle(submit(job("g", 6, gpus_per_pod=3, submit=1))) == []
    assert reason(sched, "g") == (R.NO_FIT, "pods")
    assert sched.handle([done(2, "x1")]) == []
    assert sched.jobs["g"].state is JobState.PENDING
    out = sched.handle([done(3, "x2")])
    assert starts(out) == {"g": {"n1": (0, 1, 2), "n2": (0, 1, 2)}}


# ----------------------------------------------------------- hard limits, reasons
def test_a_job_larger_than_the_cluster_is_rejected_at_submit_and_does_not_block_others():
    rules = policy(nodes=[("n1", 8)])
    sched, out = scheduler(rules, job("huge", 9), job("small", 2, submit=1))
    assert starts(out) == {"small": {"n1": (0, 1)}}
    rejected = [d for d in out if isinstance(d, Reject)]
    assert [(d.job_id, d.reason) for d in rejected] == [("huge", "gpus=9: the nodes it may use have 8 in all")]
    assert sched.jobs["huge"].state is JobState.REJECTED
    assert sched.pending_reason("huge") is None
    sched.check_invariants()


def test_a_job_above_its_team_max_exceeds_capacity_but_below_it_waits_for_quota():
    rules = policy(nodes=[("n1", 8)], teams={"ml": {"max_gpus": 4}, "web": {}})
    sched, out = scheduler(rules, job("big", 5, team="ml"), job("a", 3, team="ml"), job("b", 2, team="ml"),
                           job("w", 2, team="web"))
    assert set(starts(out)) == {"a", "w"}
    assert reason(sched, "big") == (R.EXCEEDS_CAPACITY, "teams.ml.max_gpus=4")
    assert reason(sched, "b") == (R.QUOTA_EXCEEDED, "teams.ml.max_gpus=4, in use 3")
    out = sched.handle([done(10, "a")])
    assert starts(out) == {"b": {"n1": (0, 1)}}
    assert sched.jobs["big"].state is JobState.PENDING


def test_a_parent_team_caps_its_children_together():
    rules = policy(nodes=[("n1", 8)], teams={"org": {"max_gpus": 4}, "k1": {"parent": "org"},
                                             "k2": {"parent": "org"}})
    sched, out = scheduler(rules, job("a", 3, team="k1"), job("b", 2, team="k2"), job("c", 1, team="k2"))
    assert set(starts(out)) == {"a", "c"}  # b would bring org to 5
    code, detail = reason(sched, "b")
    assert code is R.QUOTA_EXCEEDED and detail.startswith("teams.org.max_gpus=4")


def test_a_per_user_cap_counts_each_user_separately():
    rules = policy(nodes=[("n1", 8)], teams={"ml": {"max_gpus_per_user": 2}})
    sched, out = scheduler(rules, job("a", 2, team="ml", user="ann"), job("b", 1, team="ml", user="ann"),
                           job("c", 2, team="ml", user="bob"))
    assert set(starts(out)) == {"a", "c"}
    assert reason(sched, "b")[0] is R.QUOTA_EXCEEDED


def test_no_fit_on_one_node_versus_too_few_gpus():
    # a -> n1 (3 of 4), b -> n2 (3 of 4): 2 GPUs free in total, 1 on each node.
    rules = policy(nodes=[("n1", 4), ("n2", 4)])
    sched, out = scheduler(rules, job("a", 3), job("b", 3))
    assert starts(out) == {"a": {"n1": (0, 1, 2)}, "b": {"n2": (0, 1, 2)}}
    sched.handle(submit(job("two", 2, submit=1), job("three", 3, submit=1)))
    assert reason(sched, "two") == (R.NO_FIT, "single-node")
    assert reason(sched, "three") == (R.RESOURCES, "")
    # same_node on a job larger than any node can never run: refused at submit
    out = sched.handle(submit(job("wide", 5, same_node=True, submit=2)))
    assert [(d.job_id, d.reason) for d in out if isinstance(d, Reject)] == [
        ("wide", "gpus=5,same_node: at most 4 on one node")]


def test_class_reserved_gpus_are_kept_for_their_class():
    rules = policy(nodes=[("n1", 8)], classes={"production-inference": {"reserved_gpus": 2}})
    sched, out = scheduler(rules, job("b7", 7, cls="batch"))
    assert out == []
    # 7 of 8 GPUs with 2 reserved for another class: it can never start (note 015, 6)
    assert reason(sched, "b7") == (R.EXCEEDS_CAPACITY, "classes.production-inference.reserved_gpus=2")
    out = sched.handle(submit(job("b6", 6, cls="batch", submit=1)))
    assert starts(out) == {"b6": {"n1": tuple(range(6))}}  # leaves exactly the 2 reserved
    out = sched.handle(submit(job("s1", 1, cls="sandbox", submit=2)))
    assert out == []  # would eat into the reservation
    assert reason(sched, "s1") == (R.RESERVED_FOR, "classes.production-inference.reserved_gpus")
    out = sched.handle(submit(job("pi", 2, cls="production-inference", submit=3)))
    assert starts(out) == {"pi": {"n1": (6, 7)}}


# -------------------------------------------------------- cancel, exits, requeue
def test_cancel_a_running_job_frees_its_gpus_at_once():
    rules = policy(nodes=[("n1", 4)])
    sched, _ = scheduler(rules, job("a", 4), job("b", 4))
    assert sched.jobs["b"].state is JobState.PENDING
    out = sched.handle([JobCancelled(5, job_id="a")])
    assert out[0] == Stop(5, "a", reason="cancelled", grace_s=0.0)
    assert starts(out[1:]) == {"b": {"n1": (0, 1, 2, 3)}} and len(out) == 2
    assert sched.jobs["a"].state is JobState.CANCELLED
    sched.check_invariants()


def test_cancel_a_pending_job_takes_it_out_of_the_queue():
    rules = policy(nodes=[("n1", 4)])
    sched, _ = scheduler(rules, job("a", 4), job("b", 4))
    assert sched.handle([JobCancelled(1, job_id="b")]) == []
    assert sched.jobs["b"].state is JobState.CANCELLED
    assert [j.id for j in sched.pending_jobs()] == []
    assert sched.handle([done(2, "a")]) == []  # nothing left to start
    assert sched.jobs["b"].state is JobState.CANCELLED
    # cancelling again, or cancelling an unknown job, changes nothing
    assert sched.handle([JobCancelled(3, job_id="b"), JobCancelled(3, job_id="nope")]) == []
    sched.check_invariants()


def test_a_stale_or_repeated_exit_is_ignored():
    rules = policy(nodes=[("n1", 4)])
    sched, _ = scheduler(rules, job("a", 2), job("b", 2))
    sched.handle([done(5, "a")])
    assert sched.jobs["a"].state is JobState.COMPLETED
    usage = dict(sched.quota.usage)
    free = sched.ledger.free_total
    # a repeated exit, an exit with another status, an exit of an unknown job
    out = sched.handle([done(6, "a"), done(6, "a", ExitStatus.FAILED), done(6, "ghost")])
    assert out == []
    assert sched.jobs["a"].state is JobState.COMPLETED
    assert sched.jobs["b"].state is JobState.RUNNING
    assert sched.ledger.free_total == free == 2
    assert sched.quota.usage == usage
    sched.check_invariants()


def test_an_exit_of_a_pending_job_is_ignored():
    rules = policy(nodes=[("n1", 2)])
    sched, _ = scheduler(rules, job("a", 2), job("b", 2))
    assert sched.handle([done(1, "b")]) == []
    assert sched.jobs["b"].state is JobState.PENDING


def test_exit_statuses_map_to_final_states():
    rules = policy(nodes=[("n1", 4)])
    sched, _ = scheduler(rules, job("ok", 1), job("bad", 1), job("gone", 1))
    sched.handle([done(1, "ok"), done(1, "bad", ExitStatus.FAILED), done(1, "gone", ExitStatus.CANCELLED)])
    assert {j: sched.jobs[j].state for j in ("ok", "bad", "gone")} == {
        "ok": JobState.COMPLETED, "bad": JobState.FAILED, "gone": JobState.CANCELLED}
    assert sched.ledger.free_total == 4


def test_requeue_of_a_completed_job_is_a_no_op():
    rules = policy(nodes=[("n1", 2)])
    sched, _ = scheduler(rules, job("a", 2))
    sched.handle([done(3, "a")])
    assert sched.handle([JobRequeueRequested(4, job_id="a")]) == []
    assert sched.jobs["a"].state is JobState.COMPLETED
    assert sched.ledger.free_total == 2
    assert sched.pending_jobs() == []


def test_requeue_of_a_pending_job_is_a_no_op():
    rules = policy(nodes=[("n1", 2)])
    sched, _ = scheduler(rules, job("a", 2), job("b", 2))
    assert sched.handle([JobRequeueRequested(1, job_id="b")]) == []
    assert [j.id for j in sched.pending_jobs()] == ["b"]


def test_requeue_of_a_running_job_stops_it_and_it_runs_again():
    rules = policy(nodes=[("n1", 2)])
    sched, _ = scheduler(rules, job("a", 2, runtime_estimate_s=100, checkpointable=True))
    out = sched.handle([JobRequeueRequested(30, job_id="a")])
    assert out[0] == Stop(30, "a", reason="requeue", requeue=True)
    assert starts(out[1:]) == {"a": {"n1": (0, 1)}} and len(out) == 2  # the GPUs are free again at once
    a = sched.jobs["a"]
    assert a.runs == 2 and a.done_s == 30.0  # a checkpointing job keeps its work
    assert a.remaining_estimate() == 70.0


# ---------------------------------------------------------------- hardware
def test_a_lost_node_requeues_its_jobs():
    rules = policy(nodes=[("n1", 4), ("n2", 4)])
    sched, out = scheduler(rules, job("a", 4), job("b", 4))
    assert starts(out) == {"a": {"n1": (0, 1, 2, 3)}, "b": {"n2": (0, 1, 2, 3)}}
    out = sched.handle([NodeLost(10, node="n1")])
    assert out == [Stop(10, "a", reason="node-lost", requeue=True)]
    assert sched.jobs["a"].state is JobState.PENDING
    assert sched.jobs["b"].state is JobState.RUNNING
    assert reason(sched, "a")[0] is R.RESOURCES  # n2 is big enough, but busy
    assert sched.ledger.free_total == 0 and sched.ledger.healthy_total == 4
    out = sched.handle([done(20, "b")])
    assert starts(out) == {"a": {"n2": (0, 1, 2, 3)}}
    # a lost node lost twice, or an unknown node, changes nothing
    assert sched.handle([NodeLost(21, node="n1"), NodeLost(21, node="zz")]) == []
    sched.check_invariants()


def test_a_node_that_comes_back_is_used_again():
    rules = policy(nodes=[("n1", 4)])
    sched, _ = scheduler(rules)
    n1 = rules.nodes[0]
    sched.handle([NodeLost(1, node="n1")])
    sched.handle(submit(job("a", 4, submit=2)))
    assert reason(sched, "a")[0] is R.EXCEEDS_CAPACITY  # nothing healthy left
    out = sched.handle([NodeAdded(3, node=n1)])
    assert starts(out) == {"a": {"n1": (0, 1, 2, 3)}}


def test_an_unhealthy_gpu_under_a_job_requeues_that_job_only():
    rules = policy(nodes=[("n1", 4), ("n2", 4)])
    sched, out = scheduler(rules, job("a", 2), job("b", 2, same_node=True), job("c", 4))
    # a -> n1 (0,1); b -> n1 (2,3), the tightest; c -> n2
    assert starts(out) == {"a": {"n1": (0, 1)}, "b": {"n1": (2, 3)}, "c": {"n2": (0, 1, 2, 3)}}
    out = sched.handle([GpuHealthChanged(5, node="n1", gpu=3, healthy=False)])
    assert out == [Stop(5, "b", reason="gpu-failed", requeue=True)]
    assert sched.jobs["a"].state is JobState.RUNNING
    assert sched.jobs["b"].state is JobState.PENDING  # n1 has one healthy GPU free
    assert sched.ledger.healthy_total == 7
    out = sched.handle([done(6, "a")])
    # n1 has GPUs 0, 1, 2 healthy and free: b takes the lowest two
    assert starts(out) == {"b": {"n1": (0, 1)}}
    out = sched.handle(submit(job("d", 2, submit=7)))
    assert out == []  # n1 GPU 2 is free, GPU 3 is not healthy
    out = sched.handle([GpuHealthChanged(8, node="n1", gpu=3, healthy=True)])
    assert starts(out) == {"d": {"n1": (2, 3)}}
    sched.check_invariants()


def test_an_unhealthy_free_gpu_is_never_given_out():
    rules = policy(nodes=[("n1", 4)])
    sched = Scheduler(rules)
    sched.handle([GpuHealthChanged(0, node="n1", gpu=0, healthy=False)])
    out = sched.handle(submit(job("a", 3, submit=1)))
    assert starts(out) == {"a": {"n1": (1, 2, 3)}}
    sched.handle(submit(job("b", 4, submit=2)))
    assert reason(sched, "b")[0] is R.EXCEEDS_CAPACITY  # 3 healthy GPUs
    with pytest.raises(ValueError):
        sched.handle([GpuHealthChanged(3, node="n1", gpu=4, healthy=False)])


# ------------------------------------------------------------- time limits
def test_a_time_limit_stops_the_job_and_it_ends_timeout():
    rules = policy(nodes=[("n1", 2)])
    sched, _ = scheduler(rules, job("a", 2, time_limit_s=50))
    sched.handle(submit(job("b", 2, submit=10)))
    assert sched.next_wakeup() == 50.0
    assert sched.handle([Tick(49)]) == []
    out = sched.handle([Tick(50)])
    assert out == [Stop(50, "a", reason="time-limit", grace_s=0.0)]
    assert sched.jobs["a"].state is JobState.STOPPING  # it holds its GPUs until it exits
    assert sched.jobs["b"].state is JobState.PENDING
    assert sched.next_wakeup() is None
    out = sched.handle([done(50, "a", ExitStatus.TIMEOUT)])
    assert sched.jobs["a"].state is JobState.TIMEOUT
    assert starts(out) == {"b": {"n1": (0, 1)}}


def test_a_checkpointing_job_gets_its_class_grace_period_at_the_time_limit():
    rules = policy(nodes=[("n1", 4)], classes={"batch": {"grace_period_s": 30}})
    sched, _ = scheduler(rules, job("a", 2, time_limit_s=100, checkpointable=True),
                         job("b", 2, time_limit_s=100, checkpointable=False))
    out = sched.handle([Tick(100)])
    # a job that does not checkpoint gets no grace: nothing to save
    assert out == [Stop(100, "a", reason="time-limit", grace_s=30.0), Stop(100, "b", reason="time-limit")]
    # an exit of a stopping job ends it TIMEOUT whatever status the driver reports
    sched.handle([done(120, "a", ExitStatus.FAILED)])
    assert sched.jobs["a"].state is JobState.TIMEOUT
    # exit 0 too (it caught the signal and exited cleanly): Slurm's TIMEOUT, not COMPLETED
    # (a newcomer's `trap ... TERM; exit 0` job read COMPLETED)
    sched.handle([done(121, "b", ExitStatus.COMPLETED)])
    assert sched.jobs["b"].state is JobState.TIMEOUT


def test_next_wakeup_is_the_earliest_time_limit_of_a_running_job():
    rules = policy(nodes=[("n1", 4)])
    sched = Scheduler(rules)
    assert sched.next_wakeup() is None
    sched.handle(submit(job("a", 1, time_limit_s=300, submit=10)))
    sched.handle(submit(job("b", 1, time_limit_s=100, submit=20), job("c", 1, submit=20)))
    assert sched.next_wakeup() == 120.0
    sched.handle([done(30, "b")])
    assert sched.next_wakeup() == 310.0
    sched.handle([JobCancelled(40, job_id="a")])
    assert sched.next_wakeup() is None


def test_a_class_max_runtime_caps_the_time_limit():
    rules = policy(nodes=[("n1", 1)], classes={"sandbox": {"max_runtime_s": 60}})
    sched, _ = scheduler(rules, job("a", 1, cls="sandbox"))
    assert sched.next_wakeup() == 60.0
    with pytest.raises(SpecError, match="time_limit_s"):
        sched.handle(submit(job("b", 1, cls="sandbox", time_limit_s=61, submit=1)))


# ---------------------------------------------------------- input checking
def test_an_event_earlier_than_now_raises_and_changes_nothing():
    rules = policy(nodes=[("n1", 2)])
    sched, _ = scheduler(rules, job("a", 2, submit=10))
    with pytest.raises(ValueError, match="earlier"):
        sched.handle([JobCancelled(5, job_id="a")])
    assert sched.now == 10.0
    assert sched.jobs["a"].state is JobState.RUNNING
    sched.handle([Tick(10)])  # the same instant again is fine


@pytest.mark.parametrize("bad, field", [
    (job("x", 1, cls="gaming"), "class"),
    (job("x", 1, team="nobody"), "team"),
    (job("x", 0), "gpus"),
    (job("x", -1), "gpus"),
    (job("x", 4, gpus_per_pod=3), "gpus_per_pod"),
    (job("x", 1, time_limit_s=0), "time_limit_s"),
    (job("x", 1, runtime_estimate_s=-5), "runtime_estimate_s"),
    (job("", 1), "id"),
])
def test_an_invalid_spec_raises_and_nothing_of_its_instant_is_applied(bad, field):
    rules = policy(nodes=[("n1", 4)], teams={"t": {}})
    sched, _ = scheduler(rules, job("run", 2))
    good = job("good", 1, submit=5)
    events = [JobSubmitted(5, good), JobSubmitted(5, bad), JobCancelled(5, job_id="run")]
    with pytest.raises(SpecError, match=field):
        sched.handle(events)
    assert "good" not in sched.jobs and bad.id not in sched.jobs
    assert sched.jobs["run"].state is JobState.RUNNING
    assert sched.now == 0.0
    sched.check_invariants()
    # the valid part goes through on its own
    out = sched.handle([JobSubmitted(5, good)])
    assert starts(out) == {"good": {"n1": (2,)}}


def test_instants_before_an_invalid_one_are_applied():
    rules = policy(nodes=[("n1", 4)])
    sched = Scheduler(rules)
    with pytest.raises(SpecError):
        sched.handle(submit(job("a", 1, submit=1), job("b", 0, submit=2)))
    assert sched.jobs["a"].state is JobState.RUNNING and "b" not in sched.jobs
    assert sched.now == 1.0


def test_a_duplicate_job_id_is_rejected():
    rules = policy(nodes=[("n1", 4)])
    sched, _ = scheduler(rules, job("a", 1))
    with pytest.raises(SpecError, match="id"):
        sched.handle(submit(job("a", 2, submit=1)))
    assert sched.jobs["a"].gpus == 1


# -------------------------------------------------------------- preemption
def test_a_higher_class_preempts_the_most_recently_started_lowest_class_job():
    rules = policy(nodes=[("n1", 4)])
    sched, _ = scheduler(rules, job("s1", 2, cls="sandbox"))
    sched.handle(submit(job("s2", 1, cls="sandbox", submit=5), job("b1", 1, cls="batch", submit=5)))
    out = sched.handle(submit(job("p", 1, cls="production-inference", submit=10)))
    # s2 is the lowest class, most recently started: one GPU is all p needs
    assert out == [Preempt(10, "s2", grace_s=0.0, reason="priority:production-inference", preemptor="p")]
    assert sched.jobs["s2"].state is JobState.PREEMPTING
    assert reason(sched, "p") == (R.PREEMPTION_IN_PROGRESS, "s2")
    out = sched.handle([done(10, "s2", ExitStatus.PREEMPTED)])
    assert starts(out) == {"p": {"n1": (3,)}}  # b1 (batch, placed first) has GPU 2
    assert sched.jobs["s2"].state is JobState.PENDING and sched.jobs["s2"].preemptions == 1


def test_non_preemptible_work_is_never_a_victim():
    rules = policy(nodes=[("n1", 2)])
    sched, _ = scheduler(rules, job("tr", 1, cls="training"),  # training that does not checkpoint
                         job("nb", 1, cls="batch", preemptible=False))
    out = sched.handle(submit(job("p", 1, cls="production-inference", submit=1)))
    assert out == []
    assert reason(sched, "p")[0] is R.NO_PREEMPTIBLE_VICTIMS


def test_a_victim_younger_than_the_minimum_runtime_is_not_preempted():
    rules = policy(nodes=[("n1", 1)], preemption={"enabled": True, "min_runtime_s": 10})
    sched, _ = scheduler(rules, job("L", 1, cls="sandbox"))
    assert sched.handle(submit(job("A", 1, cls="production-inference", submit=9))) == []
    assert reason(sched, "A")[0] is R.NO_PREEMPTIBLE_VICTIMS
    # the same, with the victim 10 s old when the job arrives
    sched, _ = scheduler(rules, job("L", 1, cls="sandbox"))
    out = sched.handle(submit(job("A", 1, cls="production-inference", submit=10)))
    assert out == [Preempt(10, "L", grace_s=0.0, reason="priority:production-inference", preemptor="A")]


def test_a_preempted_checkpointing_job_keeps_its_work_and_restarts_later():
    rules = policy(nodes=[("n1", 2)], classes={"batch": {"grace_period_s": 5}})
    sched, _ = scheduler(rules, job("a", 2, runtime_estimate_s=100, time_limit_s=200))
    out = sched.handle(submit(job("p", 2, cls="production-inference", submit=30)))
    assert out == [Preempt(30, "a", grace_s=5.0, reason="priority:production-inference", preemptor="p")]
    out = sched.handle([done(33, "a", ExitStatus.PREEMPTED)])  # it checkpointed within its grace
    assert starts(out) == {"p": {"n1": (0, 1)}}
    a = sched.jobs["a"]
    assert a.state is JobState.PENDING and a.done_s == 30.0  # the work up to the signal
    assert a.remaining_estimate() == 70.0
    sched.handle([done(50, "p")])
    assert sched.next_wakeup() == 50.0 + 170.0  # its time limit shrinks by the banked work


def test_preemption_off_means_waiting():
    rules = policy(nodes=[("n1", 1)], preemption=False)
    sched, _ = scheduler(rules, job("s", 1, cls="sandbox"))
    assert sched.handle(submit(job("p", 1, cls="production-inference", submit=1))) == []
    assert reason(sched, "p") == (R.RESOURCES, "")


# ------------------------------------------------------------------- backfill
def test_backfill_starts_a_short_job_that_ends_before_the_reservation():
    rules = policy(nodes=[("n1", 4)], preemption=False)
    sched, _ = scheduler(rules, job("a", 2, runtime_estimate_s=100))
    sched.handle(submit(job("big", 4, submit=1)))
    assert sched.estimated_start("big") == 100.0
    out = sched.handle(submit(job("short", 2, submit=2, runtime_estimate_s=50),
                              job("long", 2, submit=2, runtime_estimate_s=500)))
    assert set(starts(out)) == {"short"}  # ends at 52 <= 100; long would delay big
    # at its turn long was refused by big's reservation; now short holds the last free
    # GPUs, and the reason is the first rule that refuses it on the state as it is
    assert reason(sched, "long") == (R.RESOURCES, "")
    assert sched.estimated_start("short") is None


def test_without_backfill_nobody_passes_a_blocked_job():
    rules = policy(nodes=[("n1", 4)], backfill=False, preemption=False)
    sched, out = scheduler(rules, job("a", 2), job("big", 4), job("small", 1))
    assert set(starts(out)) == {"a"}
    assert sched.jobs["small"].state is JobState.PENDING
    assert sched.estimated_start("big") is None


# --------------------------------------------------------------- snapshots
def test_snapshot_and_restore_keep_running_and_pending_jobs():
    rules = policy(nodes=[("n1", 4), ("n2", 4)])
    sched, _ = scheduler(rules, job("a", 4, time_limit_s=100), job("b", 2), job("c", 4))
    sched.handle([GpuHealthChanged(1, node="n2", gpu=3, healthy=False)])
    snap = json.loads(json.dumps(sched.snapshot()))
    back = Scheduler.restore(rules, snap)
    assert {j.id: j.state for j in back.jobs.values()} == {j.id: j.state for j in sched.jobs.values()}
    assert back.ledger.healthy_total == 7
    assert back.next_wakeup() == 100.0
    assert back.handle([done(5, "a")]) == sched.handle([done(5, "a")])
    assert back.jobs["c"].state is JobState.RUNNING


def test_restore_keeps_banked_work():
    rules = policy(nodes=[("n1", 2)])
    sched, _ = scheduler(rules, job("a", 2, runtime_estimate_s=100, time_limit_s=200))
    sched.handle(submit(job("p", 2, cls="production-inference", submit=30)))
    sched.handle([done(30, "a", ExitStatus.PREEMPTED)])
    back = Scheduler.restore(rules, json.loads(json.dumps(sched.snapshot())))
    assert back.jobs["a"].done_s == 30.0 and back.jobs["a"].preemptions == 1
    assert back.handle([done(50, "p")]) == sched.handle([done(50, "p")])
    assert back.next_wakeup() == sched.next_wakeup() == 220.0


def test_the_order_of_events_within_an_instant_does_not_matter():
    rules = policy(nodes=[("n1", 4), ("n2", 4)])
    base = [job("a", 4), job("b", 2), job("c", 2, cls="training")]
    batch = [JobSubmitted(5, job("d", 2, submit=5)), JobSubmitted(5, job("e", 3, cls="sandbox", submit=5)),
             JobCancelled(5, job_id="b"), JobRequeueRequested(5, job_id="c"), NodeLost(5, node="n1"),
             done(5, "a")]
    results = []
    for order in (batch, batch[::-1], batch[2:] + batch[:2]):
        sched, first = scheduler(rules, *base)
        results.append((first, sched.handle(order)))
        sched.check_invariants()
    assert results[0] == results[1] == results[2]
    # At t=0: c (training, first) -> n1 0-1, a -> n2, b -> n1 2-3. At t=5 the exit of a
    # comes first (a completes, it is not lost with n1); b and c lose n1 and are
    # cancelled / requeued (one Stop each, whichever comes first); then the pass:
    # c -> n2 0-1 (the class above batch), d -> n2 2-3; e (3) has no room.
    assert starts(results[0][0]) == {"c": {"n1": (0, 1)}, "a": {"n2": (0, 1, 2, 3)}, "b": {"n1": (2, 3)}}
    decided = results[0][1]
    assert sorted(d.job_id for d in decided if isinstance(d, Stop)) == ["b", "c"]
    assert [d for d in decided if isinstance(d, Start)] == [Start(5, "c", Placement((("n2", (0, 1)),))),
                                                            Start(5, "d", Placement((("n2", (2, 3)),)))]
    assert {j: sched.jobs[j].state for j in "abcde"} == {
        "a": JobState.COMPLETED, "b": JobState.CANCELLED, "c": JobState.RUNNING, "d": JobState.RUNNING,
        "e": JobState.PENDING}


def test_restore_rejects_a_gpu_given_twice():
    rules = policy(nodes=[("n1", 4)])
    sched, _ = scheduler(rules, job("a", 2), job("b", 2))
    snap = sched.snapshot()
    snap["jobs"][1]["alloc"] = snap["jobs"][0]["alloc"]
    with pytest.raises(ValueError):
        Scheduler.restore(rules, snap)


# ------------------------------------------- regressions (bugs these tests found)
def test_a_waiting_preemptor_is_still_held_to_its_team_quota():
    # team a may hold 4. P (a, 4) preempts V1 (grace 10); W ends at 10 and frees n2;
    # Q (a, 4, higher class) takes 4 of n2; P may not take the other 4 while Q runs.
    rules = policy(nodes=[("n1", 4), ("n2", 8)], teams={"a": {"max_gpus": 4}, "b": {}},
                   classes={"sandbox": {"grace_period_s": 10}})
    res = simulate(rules, [(job("V1", 4, "sandbox", "b", 0), 100.0),
                           (job("W", 8, "production-inference", "b", 0), 10.0),
                           (job("P", 4, "training", "a", 1, checkpointable=True), 50.0),
                           (job("Q", 4, "production-inference", "a", 2), 50.0)])
    p, q = res.records["P"], res.records["Q"]
    assert res.records["V1"].preempted_at == [1.0]
    # a preemptor takes its turn first (note 015): P starts at 10 on n2's free GPUs; Q
    # waits for team a's quota while P runs - never both at once
    assert p.starts[0][0] == 10.0
    assert q.starts[0][0] >= p.end, f"Q started at {q.starts[0][0]} while P held team a's 4 GPUs"


def test_strict_order_holds_for_jobs_submitted_later():
    rules = policy(nodes=[("n1", 3)], backfill=False, preemption=False)
    sched, _ = scheduler(rules, job("a", 1))
    sched.handle(submit(job("big", 3, submit=1)))
    assert reason(sched, "big") == (R.RESOURCES, "")
    out = sched.handle(submit(job("late", 1, submit=2)))
    assert out == [], f"late passed the blocked job big: {out}"
    out = sched.handle([done(3, "a")])
    assert starts(out) == {"big": {"n1": (0, 1, 2)}}


def test_a_gang_of_pods_that_can_never_fit_exceeds_capacity():
    # 5 pods x 2 GPUs on nodes of 1, 1, 8 GPUs: 10 GPUs in all, room for 4 pods only
    rules = policy(nodes=[("n1", 1), ("n2", 1), ("n3", 8)], backfill=False)
    sched, out = scheduler(rules, job("gang", 10, gpus_per_pod=2), job("small", 1))
    assert sched.jobs["gang"].state is JobState.REJECTED
    assert "the gang cannot be laid out" in sched.jobs["gang"].reason.detail
    assert set(starts(out)) == {"small"}  # it does not block a strict-order queue


def test_a_backfilled_job_does_not_delay_a_reservation_through_the_team_quota():
    # X (team a, 4 of a's 4) is planned for t=10; Y (team a, 1 GPU, until t=22) fits
    # the spare GPU but would leave X over quota at t=10.
    rules = policy(nodes=[("n1", 5)], teams={"a": {"max_gpus": 4}, "b": {}}, preemption=False)
    jobs = [(job("B1", 4, team="b", runtime_estimate_s=10), 10.0),
            (job("X", 4, team="a", submit=1, runtime_estimate_s=5), 5.0),
            (job("Y", 1, team="a", submit=2, runtime_estimate_s=20), 20.0)]
    sched, _ = scheduler(rules, *(s for s, _ in jobs[:2]))
    assert sched.estimated_start("X") == 10.0
    res = simulate(rules, jobs)
    assert res.records["X"].starts[0][0] == 10.0
    assert res.records["Y"].starts[0][0] == 15.0  # after X, within a's quota


def test_a_blocked_job_preempts_once_the_victim_reaches_the_minimum_runtime():
    rules = policy(nodes=[("n1", 1)], preemption={"enabled": True, "min_runtime_s": 10})
    res = simulate(rules, [(job("L", 1, "sandbox"), 100.0), (job("A", 1, "production-inference", submit=1), 5.0)])
    assert res.records["L"].preempted_at == [10.0]
    assert res.records["A"].starts[0][0] == 10.0


def test_the_oldest_blocked_job_is_the_preemptor():
    rules = policy(nodes=[("n1", 1)], preemption={"enabled": True, "min_runtime_s": 30},
                   classes={"sandbox": {"grace_period_s": 5}})
    sched, _ = scheduler(rules, job("L", 1, "sandbox"))
    sched.handle(submit(job("A", 1, "production-inference", submit=1)))
    out = sched.handle(submit(job("B", 1, "production-inference", submit=20)))
    assert out == []  # L is 20 s old: not yet
    out = sched.handle([Tick(30)])
    assert [(d.job_id, d.preemptor) for d in out if isinstance(d, Preempt)] == [("L", "A")]
    # the same when L comes of age before B is submitted: B's submission may not make
    # B the preemptor (a pass over the new job only would)
    sched, _ = scheduler(rules, job("L", 1, "sandbox"))
    sched.handle(submit(job("A", 1, "production-inference", submit=1)))
    out = sched.handle(submit(job("B", 1, "production-inference", submit=40)))
    assert [(d.job_id, d.preemptor) for d in out if isinstance(d, Preempt)] == [("L", "A")]


def test_a_job_ending_early_moves_the_reservation_earlier():
    # A (estimate 100) ends at 10; B ends at 20: X (3 GPUs) can start at 20. Y (until
    # t=60) would delay it, so Y must wait.
    rules = policy(nodes=[("n1", 3)], preemption=False)
    res = simulate(rules, [(job("A", 1, runtime_estimate_s=100), 10.0), (job("B", 1, runtime_estimate_s=20), 20.0),
                           (job("X", 3, submit=1, runtime_estimate_s=10), 10.0),
                           (job("Y", 1, submit=10, runtime_estimate_s=50), 50.0)])
    assert res.records["X"].starts[0][0] == 20.0
    assert res.records["Y"].starts[0][0] == 30.0


def test_a_later_job_of_the_same_class_does_not_preempt_into_a_reservation():
    P = "production-inference"
    rules = policy(nodes=[("n1", 2), ("n2", 2)])
    jobs = [(job("A", 2, P, runtime_estimate_s=10), 10.0),
            (job("R", 3, P, submit=1, runtime_estimate_s=10), 10.0),
            (job("H", 2, P, submit=2, same_node=True), 100.0),
            (job("L", 1, "research-training", submit=3), 100.0),
            (job("Z", 4, "sandbox"), 5.0)]
    sched, _ = scheduler(rules, *(s for s, _ in jobs[:2]))
    assert sched.estimated_start("R") == 10.0
    res = simulate(rules, jobs, [JobCancelled(4, job_id="Z")])  # the cancel makes a full pass at t=4
    assert res.records["R"].starts[0][0] == 10.0


def test_a_node_that_comes_back_with_a_broken_gpu_does_not_give_it_out():
    rules = policy(nodes=[("n1", 2)])
    sched = Scheduler(rules)
    sched.handle([NodeLost(0, node="n1")])
    out = sched.handle([NodeAdded(1, node=rules.nodes[0]), GpuHealthChanged(1, node="n1", gpu=0, healthy=False)]
                       + submit(job("b", 2, submit=1)))
    assert out == [] and sched.ledger.healthy_total == 1


def test_contradicting_health_reports_of_one_instant_do_not_depend_on_their_order():
    rules = policy(nodes=[("n1", 1)])
    outcomes = []
    for flip in (False, True):
        sched = Scheduler(rules)
        reports = [GpuHealthChanged(0, node="n1", gpu=0, healthy=False),
                   GpuHealthChanged(0, node="n1", gpu=0, healthy=True)]
        sched.handle(reports[::-1] if flip else reports)
        outcomes.append(sched.handle(submit(job("a", 1, submit=1))))
    assert outcomes[0] == outcomes[1]


def test_a_quota_reason_names_the_usage_after_the_pass():
    rules = policy(nodes=[("n1", 8)], teams={"org": {"max_gpus": 4}, "k1": {"parent": "org"},
                                             "k2": {"parent": "org"}})
    sched, _ = scheduler(rules, job("a", 3, team="k1"), job("b", 2, team="k2"), job("c", 1, team="k2"))
    assert reason(sched, "b") == (R.QUOTA_EXCEEDED, "teams.org.max_gpus=4, in use 4")

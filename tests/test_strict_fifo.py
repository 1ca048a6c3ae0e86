"""Strict FIFO queues (issue 13 point 3, note 031): ``classes.X.queueing`` and
``teams.T.classes.X.queueing`` (Kueue's ``StrictFIFO`` / ``BestEffortFIFO``)."""

from __future__ import annotations

import pytest
from builders import job, node, policy, policy_dict

from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Start
from gpushepherd.model.events import JobFinished, JobSubmitted
from gpushepherd.policy import PolicyError, policy_from_dict


def _started(out) -> list[str]:
    return [d.job_id for d in out if isinstance(d, Start)]


def _run(rules, *jobs):
    sched = Scheduler(rules)
    out = []
    for spec in jobs:
        out += sched.handle([JobSubmitted(spec.submit_time, spec)])
    return sched, _started(out)


@pytest.mark.parametrize("queueing, j_starts", [("best_effort_fifo", True), ("strict_fifo", False), (None, True)])
def test_a_strict_class_lets_no_later_job_pass_its_waiting_head(queueing, j_starts):
    # 4 GPUs: X holds 2 till 100. H (4 GPUs) waits for X and holds the reservation at
    # 100; J (1 GPU, done by 50) fits beside it and delays nobody: backfill starts it -
    # unless batch is one strict FIFO queue, where J waits for H.
    classes = {"batch": {"queueing": queueing}} if queueing else None
    rules = policy(nodes=[("n1", 4)], classes=classes, preemption=False)
    sched, started = _run(rules, job("X", 2, "batch", "t", 0, runtime_estimate_s=100.0),
                          job("H", 4, "batch", "t", 1, runtime_estimate_s=100.0),
                          job("J", 1, "batch", "t", 2, runtime_estimate_s=50.0))
    assert started == (["X", "J"] if j_starts else ["X"])
    if not j_starts:
        assert str(sched.pending_reason("J")) == "Priority(H)"
        assert str(sched.pending_reason("H")) == "Resources"
        # once X ends, H starts first, then J behind it
        out = sched.handle([JobFinished(100.0, "X")])
        assert _started(out) == ["H"]
        assert str(sched.pending_reason("J")) == "Resources"


def test_a_head_waiting_for_other_gpus_holds_nobody_back():
    # H asks for H100s, which X holds; J asks for A100s, 4 free: the strict queue's head
    # does not block work for GPUs it cannot use (head-of-line blocking scoped by nodes)
    rules = policy(nodes=[node("a1", 4, "A100-80GB"), node("h1", 4, "H100-80GB")],
                   classes={"batch": {"queueing": "strict_fifo"}}, preemption=False)
    sched, started = _run(rules, job("X", 4, "batch", "t", 0, gpu_types=("H100-80GB",)),
                          job("H", 2, "batch", "t", 1, gpu_types=("H100-80GB",)),
                          job("J", 2, "batch", "t", 2, gpu_types=("A100-80GB",)),
                          job("K", 1, "batch", "t", 3))  # any type: behind H on h1's nodes too
    assert started == ["X", "J"]
    assert str(sched.pending_reason("K")) == "Priority(H)"


def test_a_head_that_can_never_start_holds_nobody_back():
    # team a may hold 2 GPUs ever: H (4) can never start and must not block J for good
    rules = policy(nodes=[("n1", 4)], teams={"a": {"max_gpus": 2}}, classes={"batch": {"queueing": "strict_fifo"}},
                   preemption=False)
    sched, started = _run(rules, job("H", 4, "batch", "a", 0), job("J", 1, "batch", "a", 1))
    assert started == ["J"]
    assert str(sched.pending_reason("H")).startswith("ExceedsCapacity(teams.a.max_gpus=2")


def test_a_teams_strict_queue_holds_back_only_that_teams_jobs():
    # team a's batch queue is strict: a's J waits behind a's H; b's K (same shape) starts
    rules = policy(nodes=[("n1", 4)], teams={"a": {"classes": {"batch": {"queueing": "strict_fifo"}}}, "b": {}},
                   preemption=False)
    sched, started = _run(rules, job("X", 2, "batch", "a", 0, runtime_estimate_s=100.0),
                          job("H", 4, "batch", "a", 1, runtime_estimate_s=100.0),
                          job("J", 1, "batch", "a", 2, runtime_estimate_s=50.0),
                          job("K", 1, "batch", "b", 3, runtime_estimate_s=50.0))
    assert started == ["X", "K"]
    assert str(sched.pending_reason("J")) == "Priority(H)"


def test_a_higher_class_is_not_held_back_by_a_strict_lower_class():
    # the strict queue is the class: a production-inference job is in no queue of batch
    rules = policy(nodes=[("n1", 4)], classes={"batch": {"queueing": "strict_fifo"}}, preemption=False)
    _sched, started = _run(rules, job("X", 2, "batch", "t", 0, runtime_estimate_s=100.0),
                           job("H", 4, "batch", "t", 1, runtime_estimate_s=100.0),
                           job("P", 1, "production-inference", "t", 2, runtime_estimate_s=50.0))
    assert started == ["X", "P"]


@pytest.mark.parametrize("where", ["classes", "teams"])
def test_a_queueing_strategy_that_is_not_one_is_refused_naming_the_field(where):
    raw = policy_dict(nodes=[("n1", 4)], teams={"a": {}})
    if where == "classes":
        raw["classes"] = {"batch": {"queueing": "StrictFIFO"}}
        field = "classes.batch.queueing"
    else:
        raw["teams"]["a"]["classes"] = {"batch": {"queueing": "lifo"}}
        field = "teams.a.classes.batch.queueing"
    with pytest.raises(PolicyError) as err:
        policy_from_dict(raw)
    text = str(err.value)
    assert field in text and "best_effort_fifo" in text and "strict_fifo" in text

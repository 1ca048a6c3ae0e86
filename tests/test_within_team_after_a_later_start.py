"""A job refused at its turn by a rule other than its team's limit (no free GPUs), with
preemption off, cannot preempt. A lower-class job of its team started later in the same
pass may make the team's limit refuse it: where the team lets a job preempt within it
(note 035), its preemption step then finds the team's lower-class jobs. Before the fix
the pass ended there; a full pass at the same instant, or a restart, preempted at once,
and the uninterrupted core only at its next wake-up (oracle seed 494358, property
``f_restart``: the start was a share joining a card, so no free GPU was taken). The start
now asks for another pass (``again._within_now``). Both cores; scenario I20-56. A review
found two more shapes, each below: a job of several GPU types under a per-type limit (its
turn read at rest, without the per-type charges), and the fast walk's skip of a sub-queue
refused for room (``fail_fit``), which never reached ``Turn.blocked``.
"""

from __future__ import annotations

import json

import pytest
from builders import job, node, policy_dict
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Preempt, Start
from gpushepherd.model.events import JobFinished, JobSubmitted, Tick
from gpushepherd.model.job import GpuShare
from gpushepherd.policy import policy_from_dict

HALF = GpuShare(kind="fraction", milli=500)


def _rules(within: str = "lower_priority", **kw):
    raw = policy_dict(nodes=[node("n1", 4), node("n2", 1)],
                      teams={"a": {"max_gpus": 4, "preemption": {"within_team": within}}, "b": {}},
                      preemption={"enabled": False, "min_runtime_s": 0.0}, **kw)
    return policy_from_dict(raw).rules


def _sub(t, jid, gpus, cls, team, est, **kw):
    return JobSubmitted(t, job(jid, gpus, cls, team, t, runtime_estimate_s=est, **kw))


def _nothing_left_at(t, s, rules, reference):
    """A full pass at ``t`` on ``s``, and on a core restored from its snapshot, decide nothing."""
    assert s.handle([Tick(t)]) == []
    restored = Scheduler.restore(rules, json.loads(json.dumps(s.snapshot())), reference=reference)
    assert restored.handle([Tick(t)]) == []


def _run(reference, within="lower_priority"):
    rules = _rules(within)
    s = Scheduler(rules, reference=reference)
    # n1: V (a, sandbox) and X (b) one GPU each, two free; n2:0 half taken by W's share (b)
    first = s.handle([_sub(0, "V", 1, "sandbox", "a", 1000), _sub(0, "X", 1, "training", "b", 1000),
                      _sub(0, "W", 1, "batch", "b", 1000, share=HALF)])
    assert sorted(d.job_id for d in first if isinstance(d, Start)) == ["V", "W", "X"]
    # R (b, production inference, 4 GPUs) waits ahead of P and holds the one reservation
    assert s.handle([_sub(5, "R", 4, "production-inference", "b", 100, gpus_per_pod=1)]) == []
    # P (a, production inference, 3 GPUs): a would use 1 + 3 <= 4, but two GPUs are free,
    # preemption is off, and R holds the reservation. L (a, batch, half a GPU) joins W's card: a uses 1.5, and
    # 1.5 + 3 > 4 - now only a's limit refuses P, and evicting V (a, sandbox) frees a's
    # limit and a third GPU on n1
    out = s.handle([_sub(10, "P", 3, "production-inference", "a", 100, gpus_per_pod=1),
                    _sub(10, "L", 1, "batch", "a", 5, share=HALF)])
    return rules, s, out


@pytest.mark.parametrize("reference", [False, True])
def test_a_later_start_that_makes_the_teams_limit_refuse_a_job_lets_it_preempt_within_the_team_at_once(reference):
    rules, s, out = _run(reference)
    assert [d.job_id for d in out if isinstance(d, Start)] == ["L"]
    assert [(d.job_id, d.preemptor) for d in out if isinstance(d, Preempt)] == [("V", "P")]
    # nothing left for a full pass at the same instant, nor for a restart
    _nothing_left_at(10, s, rules, reference)


@pytest.mark.parametrize("reference", [False, True])
def test_without_within_team_preemption_the_start_asks_nothing(reference):
    rules, s, out = _run(reference, within="never")
    assert [d.job_id for d in out if isinstance(d, Start)] == ["L"] and not [d for d in out if isinstance(d, Preempt)]
    _nothing_left_at(10, s, rules, reference)


@pytest.mark.parametrize("reference", [False, True])
def test_a_job_of_several_gpu_types_under_a_per_type_limit_preempts_at_once_too(reference):
    # the same, with a's limit per GPU type (A100 4) and P free to take any type: P's turn
    # ends at rest (its base charges name no per-type limit), so the repeat rule must read
    # the variant a full pass takes (typed.any_variant)
    raw = policy_dict(nodes=[node("n1", 4), node("n2", 1, gpu_type="H100-80GB")],
                      teams={"a": {"max_gpus": {"A100-80GB": 4}, "preemption": {"within_team": "lower_priority"}},
                             "b": {}},
                      preemption={"enabled": False, "min_runtime_s": 0.0})
    rules = policy_from_dict(raw).rules
    s = Scheduler(rules, reference=reference)
    a100, h100 = ("A100-80GB",), ("H100-80GB",)
    s.handle([_sub(0, "V", 1, "sandbox", "a", 1000, gpu_types=a100), _sub(0, "X", 1, "training", "b", 1000,
                                                                           gpu_types=h100),
              _sub(0, "W", 1, "batch", "b", 1000, share=HALF, gpu_types=a100)])
    s.handle([_sub(5, "R", 4, "production-inference", "b", 100, gpus_per_pod=1, gpu_types=a100)])
    out = s.handle([_sub(10, "P", 3, "production-inference", "a", 100, gpus_per_pod=1),
                    _sub(10, "L", 1, "batch", "a", 5, share=HALF, gpu_types=a100)])
    assert [d.job_id for d in out if isinstance(d, Start)] == ["L"]
    assert [(d.job_id, d.preemptor) for d in out if isinstance(d, Preempt)] == [("V", "P")]
    _nothing_left_at(10, s, rules, reference)


@pytest.mark.parametrize("reference", [False, True])
def test_a_job_the_fast_walk_skips_for_room_is_kept_for_the_repeat_too(reference):
    # R (b) now has P's shape (3 GPUs, one a pod) and is refused for room first: the fast
    # walk skips P's sub-queue on that fact (fail_fit) without its turn; Z's end at 10 makes
    # the walk a full one. Before the review the fast core decided Start(L) only, the
    # reference core Start(L) and Preempt(V for P)
    rules = _rules(backfill=1)
    s = Scheduler(rules, reference=reference)
    s.handle([_sub(0, "V", 1, "sandbox", "a", 1000), _sub(0, "X", 1, "training", "b", 1000),
              _sub(0, "W", 1, "batch", "b", 1000, share=HALF), _sub(0, "Z", 1, "batch", "b", 10)])
    assert s.handle([_sub(5, "R", 3, "production-inference", "b", 100, gpus_per_pod=1)]) == []
    out = s.handle([JobFinished(10, job_id="Z"), _sub(10, "P", 3, "production-inference", "a", 100, gpus_per_pod=1),
                    _sub(10, "L", 1, "batch", "a", 5, share=HALF)])
    assert [d.job_id for d in out if isinstance(d, Start)] == ["L"]
    assert [(d.job_id, d.preemptor) for d in out if isinstance(d, Preempt)] == [("V", "P")]
    _nothing_left_at(10, s, rules, reference)

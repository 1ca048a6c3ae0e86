"""The fast walk's room lemma does not cover a job of several GPU types (oracle seed
531297, property a_equal).

The walk records a failed placement of ``k`` GPUs per node filter (``Walk.fail_fit``) and
passes later jobs of that filter asking ``>= k`` as refused for room, with no placement
tried. A job under per-GPU-type limits is placed on each type in turn (note 038). On one
type its shape may differ: four GPUs on nodes of two each span nodes, while the job at
rest, where a 4-GPU node exists, must fit one node. Such a job was still passed as
refused, so the fast core left it waiting while the reference core started it. Now the
lemma skips such a job, as recording a failure already did.

The same held for the sub-queue lemma (a review of note 089): jobs of one sub-queue share
their shape at rest, but one that asks for one node (``same_node``, one pod) and one that
may span nodes differ on a type of small nodes; the first refused for good (or for a
limit now, the depth reached) made the walk skip the second. A typed job's refusal now
says nothing of the next job of its sub-queue."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import job, node, policy, policy_dict
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Start
from gpushepherd.model.events import JobFinished, JobSubmitted
from oracle_hypothesis import PROFILE, assert_clean
from oracle_workloads import Workload


@pytest.mark.parametrize("reference", [False, True])
def test_a_job_of_several_gpu_types_is_placed_after_a_refusal_for_room(reference):
    rules = policy(nodes=[node("n1", 4, "A100-80GB"), node("n3", 2, "L40S"), node("n4", 2, "L40S")],
                   teams={"a": {"max_gpus": {"A100-80GB": 2, "L40S": 4}}, "c": {}}, preemption=False)
    s = Scheduler(rules, reference=reference)
    out = s.handle([JobSubmitted(0, job("B", 2, "batch", "c", gpu_types=("A100-80GB",), runtime_estimate_s=1000.0))])
    assert [d.job_id for d in out if isinstance(d, Start)] == ["B"]  # on n1: two of its GPUs left
    # X (c, 4 GPUs, higher class) finds no node with 4 free GPUs and reserves n1; Y (a, 4
    # GPUs) is then placed per type: on L40S, nodes of 2, it spans n3 and n4 - off X's node
    out = s.handle([JobSubmitted(10, job("X", 4, "production-inference", "c", 10, runtime_estimate_s=100.0)),
                    JobSubmitted(10, job("Y", 4, "batch", "a", 10, runtime_estimate_s=100.0))])
    starts = {d.job_id: d.placement.parts for d in out if isinstance(d, Start)}
    assert starts == {"Y": (("n3", (0, 1)), ("n4", (0, 1)))}
    assert str(s.pending_reason("X")) == "Resources"  # it holds the reservation on n1


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("one_node", [{"same_node": True}, {"gpus_per_pod": 4}])
def test_a_typed_job_is_turned_after_one_of_its_sub_queue_that_never_fits(reference, one_node):
    # j2 and j3 share a sub-queue at rest (4 GPUs: n1 holds them). On L40S j3 may span l0 and
    # l1; j2, one node, can never fit there - nor on A100 (a's limit 1): never fits at all
    rules = policy(nodes=[node("n1", 4, "A100-80GB"), node("l0", 2, "L40S"), node("l1", 2, "L40S")],
                   teams={"a": {"max_gpus": {"A100-80GB": 1}}, "b": {}})
    s = Scheduler(rules, reference=reference)
    out = s.handle([JobSubmitted(0, job("B", 2, "batch", "b", gpu_types=("L40S",)))])
    out += s.handle([JobSubmitted(10, job("j2", 4, "batch", "a", 10, runtime_estimate_s=100.0, **one_node))])
    out += s.handle([JobSubmitted(40, job("j3", 4, "batch", "a", 40, runtime_estimate_s=100.0))])
    out += s.handle([JobFinished(120, "B")])
    starts = {d.job_id: d.placement.parts for d in out if isinstance(d, Start)}
    assert starts["j3"] == (("l0", (0, 1)), ("l1", (0, 1)))  # before: the fast core left it waiting
    assert str(s.pending_reason("j2")).startswith("ExceedsCapacity")


@st.composite
def typed_sub_queues(draw) -> Workload:
    """Per-GPU-type limits on a team whose jobs share a sub-queue at rest (one big A100
    node holds them) but not on L40S, whose nodes are small: one node asked for
    (``same_node``, one pod) or not, and a few other jobs; backfill depth, preemption and
    strict FIFO drawn."""
    big = draw(st.sampled_from([4, 8]))
    small = draw(st.sampled_from([1, 2]))
    n_small = draw(st.integers(2, 4))
    nodes = [node("n1", big, "A100-80GB")] + [node(f"l{i}", small, "L40S") for i in range(n_small)]
    limits = {"A100-80GB": draw(st.integers(0, big))}
    if draw(st.booleans()):
        limits["L40S"] = draw(st.integers(2, small * n_small))
    raw = policy_dict(nodes=nodes, teams={"a": {"max_gpus": limits}, "b": {}},
                      classes={"batch": {"queueing": "strict_fifo"}} if draw(st.integers(0, 4)) == 0 else None,
                      preemption={"enabled": draw(st.booleans()), "min_runtime_s": 0.0},
                      backfill=draw(st.sampled_from([False, True, 1, 2])))
    jobs = []
    for i in range(draw(st.integers(1, 2))):  # b's jobs on small nodes or the big one
        est = float(draw(st.sampled_from([50, 120, 1000])))
        jobs.append((job(f"b{i}", draw(st.sampled_from([1, small])), "training", "b", 0.0,
                         gpu_types=(draw(st.sampled_from(["L40S", "A100-80GB"])),), runtime_estimate_s=est), est))
    k = draw(st.sampled_from(sorted({2, 4, big})))
    for i in range(draw(st.integers(2, 5))):
        kw = draw(st.sampled_from([{}, {}, {"same_node": True}, {"gpus_per_pod": k}, {"gpus_per_pod": 1}]))
        est = float(draw(st.sampled_from([100, 300])))
        jobs.append((job(f"a{i}", k, draw(st.sampled_from(["batch", "training"])), "a",
                         float(draw(st.sampled_from([5, 10, 20, 40]))) + 0.001 * i, user="u1",
                         runtime_estimate_s=est, **kw), est))
    return Workload(raw, jobs, [])


@settings(max_examples=80, **PROFILE)
@given(typed_sub_queues())
def test_typed_jobs_of_one_sub_queue_pass_the_oracle(wl):
    assert_clean(wl)

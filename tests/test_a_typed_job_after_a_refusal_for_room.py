"""The fast walk's room lemma does not cover a job of several GPU types (oracle seed
531297, property a_equal).

The walk records a failed placement of ``k`` GPUs per node filter (``Walk.fail_fit``) and
passes later jobs of that filter asking ``>= k`` as refused for room, with no placement
tried. A job under per-GPU-type limits is placed on each type in turn (note 038). On one
type its shape may differ: four GPUs on nodes of two each span nodes, while the job at
rest, where a 4-GPU node exists, must fit one node. Such a job was still passed as
refused, so the fast core left it waiting while the reference core started it. Now the
lemma skips such a job, as recording a failure already did."""

from __future__ import annotations

import pytest
from builders import job, node, policy
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Start
from gpushepherd.model.events import JobSubmitted


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

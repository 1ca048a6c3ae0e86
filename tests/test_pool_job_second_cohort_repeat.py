"""A job confined to a pool counts in the pool's cohort and in a cohort of every pool
(note 050); ``Job.cohort`` names the first only. A start that makes another member
borrow in the second makes that member's lower-class jobs victims there (the victim
rule, ``preemption._lenders``, reads every cohort), so it must ask for another pass as it
does in the first: before note 082's fix ``again.after_start`` read the refused job's
cohorts through ``typed.cohorts_of`` (``Job.cohort``), asked nothing, and the preemption
waited for the next wake-up while a full pass at the same instant (or a restart)
preempted at once (oracle seed 441895, property ``f_restart``). Both cores; scenario
I20-54.
"""

from __future__ import annotations

import json

import pytest
from builders import job, node, policy_dict
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Preempt, Start
from gpushepherd.model.events import JobSubmitted, Tick
from gpushepherd.policy import policy_from_dict


def _rules():
    raw = policy_dict(nodes=[node("n1", 3), node("n4", 1, gpu_type="A100-40GB", gpu_mem_mib=40960, pool="inf")],
                      teams={"a": {"nominal_gpus": 2}, "b": {"nominal_gpus": 2}},
                      classes={"production-inference": {"pools": ["inf"]}, "batch": {"pools": ["inf"]},
                               "research-training": {"pools": ["default"]}},
                      preemption={"enabled": True, "min_runtime_s": 100},
                      cohorts={"co": {"members": ["a", "b"], "reclaim": "lower_priority"},
                               "co_inf": {"members": [{"team": "a", "nominal_gpus": 1}], "pool": "inf",
                                          "reclaim": "any"}})
    raw["cluster"]["pools"] = [{"name": "default"}, {"name": "inf"}]
    return policy_from_dict(raw).rules


def _sub(t, jid, cls, team, est):
    return JobSubmitted(t, job(jid, 1, cls, team, t, runtime_estimate_s=est))


@pytest.mark.parametrize("reference", [False, True])
def test_a_start_that_makes_a_member_borrow_in_a_pool_jobs_second_cohort_lets_it_preempt_at_once(reference):
    # B (b, batch) holds n4, the only GPU of pool inf; T (b) holds n1:0: b uses its
    # nominal 2 in co, so B is kept from P (a, production inference, pool inf). J (b) at
    # 2000 makes b borrow 3 > 2 in co: B is a victim for P in the same instant.
    rules = _rules()
    s = Scheduler(rules, reference=reference)
    s.handle([_sub(0, "B", "batch", "b", 10000), _sub(0, "T", "research-training", "b", 10000)])
    assert s.handle([_sub(1000, "P", "production-inference", "a", 1000)]) == []
    assert str(s.pending_reason("P")).startswith("NoPreemptibleVictims(b is within its nominal 2 in cohorts.co")
    out = s.handle([_sub(2000, "J", "research-training", "b", 1000)])
    assert [d.job_id for d in out if isinstance(d, Start)] == ["J"]
    assert [(d.job_id, d.preemptor) for d in out if isinstance(d, Preempt)] == [("B", "P")]
    # nothing left for a full pass at the same instant, nor for a restart
    assert s.handle([Tick(2000)]) == []
    restored = Scheduler.restore(rules, json.loads(json.dumps(s.snapshot())), reference=reference)
    assert restored.handle([Tick(2000)]) == []

"""A preemption plan refused by a claim (a reservation that binds the job) is looked at
again when a later start in the same pass changes which claims bind it
(``Profile.reclaimers_of``): the job's own member starts to borrow (a lending claim no
longer binds a borrower), or the claim's member would borrow at the claim's start (the
job would reclaim it then). Before, only a refusal at the job's turn by the claims asked
for a repeat (``Turn.claims_refused``); a job refused at its turn for room whose plan a
claim refused was not looked at again, and a full pass at the same instant (or a
restart) preempted where the uninterrupted core did not (review of note 082). Both
cores.

Also (the same review): a pool job's second cohort when the *started* job counts in the
refused job's own cohort only through its pool (case B): the refused job reclaims a
same-class job there at once."""

from __future__ import annotations

import json

import pytest
from gpushepherd.core.scheduler import Scheduler
from gpushepherd.model.decisions import Preempt
from gpushepherd.model.events import JobSubmitted, Tick
from gpushepherd.model.job import JobSpec
from gpushepherd.policy import policy_from_dict


def _sub(t, jid, cls, team, gpus=1, **kw):
    return JobSubmitted(float(t), JobSpec(id=jid, team=team, workload_class=cls, gpus=gpus, user="u1",
                                          submit_time=float(t), **kw))


def _two_pools(teams: dict, classes: dict, cohorts: dict, n1: int = 2, n2: int = 1, n2_type="A100-80GB") -> dict:
    return {"cluster": {"nodes": [{"name": "n1", "gpus": n1, "gpu_type": "A100-80GB", "gpu_mem_mib": 81920},
                                  {"name": "n2", "gpus": n2, "gpu_type": n2_type, "gpu_mem_mib": 81920, "pool": "inf"}],
                        "pools": [{"name": "default"}, {"name": "inf"}]},
            "teams": teams, "classes": classes, "cohorts": cohorts,
            "preemption": {"enabled": True, "min_runtime_s": 100}, "backfill": {"enabled": True}}


CLASSES = {"sandbox": {"pools": ["inf"]}, "research-training": {"pools": ["default"]},
           "training": {"pools": ["default"]}, "batch": {"pools": ["default"]},
           "production-inference": {"pools": ["default"]}}
CO = {"co": {"members": ["a", "b"], "reclaim": "any"}}

# n1 (2 GPUs) is full at 1000 (B1, V of team c); R (b, 2 GPUs) waits for b's hard limit
# (D) or for room (D2) and holds a claim on n1; P (a, 1 GPU) finds no free GPU, and its
# plan (evict V) is refused by R's claim. X's start then unbinds the claim from P.
CASES = {
    # X of P's own team a: a borrows now, and R's claim lends (b's hard limit keeps R) -
    # a lending claim does not bind a borrower
    "own member borrows": (
        _two_pools({"a": {"nominal_gpus": 1}, "b": {"nominal_gpus": 2, "max_gpus": 2}, "c": {}}, CLASSES, CO),
        [[_sub(0, "B1", "training", "b", runtime_estimate_s=5000), _sub(0, "V", "batch", "c", runtime_estimate_s=3000)],
         [_sub(1000, "R", "training", "b", gpus=2, runtime_estimate_s=10000),
          _sub(1000, "P", "research-training", "a", runtime_estimate_s=10000),
          _sub(1000, "X", "sandbox", "a", runtime_estimate_s=10000)]]),
    # X of R's team b: b would borrow at R's start, which P (within its nominal) would
    # reclaim then - R's claim no longer binds P
    "claim's member would borrow": (
        _two_pools({"a": {"nominal_gpus": 1}, "b": {"nominal_gpus": 2}, "c": {}}, CLASSES, CO),
        [[_sub(0, "B1", "production-inference", "c", runtime_estimate_s=5000),
          _sub(0, "V", "batch", "c", runtime_estimate_s=3000)],
         [_sub(1000, "R", "training", "b", gpus=2, runtime_estimate_s=10000, checkpointable=True),
          _sub(1000, "P", "research-training", "a", runtime_estimate_s=10000),
          _sub(1000, "X", "sandbox", "b", runtime_estimate_s=10000)]]),
}


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_start_that_unbinds_a_claim_from_a_refused_plan_asks_for_another_pass(case, reference):
    raw, calls = CASES[case]
    rules = policy_from_dict(raw).rules
    s = Scheduler(rules, reference=reference)
    s.handle(calls[0])
    out = s.handle(calls[1])
    assert [(d.job_id, d.preemptor) for d in out if isinstance(d, Preempt)] == [("V", "P")]
    assert s.handle([Tick(1000)]) == []
    restored = Scheduler.restore(rules, json.loads(json.dumps(s.snapshot())), reference=reference)
    assert restored.handle([Tick(1000)]) == []


@pytest.mark.parametrize("reference", [False, True])
def test_a_start_in_a_pool_cohort_lets_a_member_reclaim_in_its_own_cohort(reference):
    # X (b, batch, pool inf) counts in co_inf (its Job.cohort) and in co: b holds 2 in co
    # with V1 and V2, 3 with X, over its nominal 2 - P (a, within its nominal, reclaim
    # any) may reclaim a training job of b's at once
    raw = _two_pools({"a": {"nominal_gpus": 2}, "b": {"nominal_gpus": 2}},
                     {"batch": {"pools": ["inf"]}, "training": {"pools": ["default"]}},
                     {"co": {"members": ["a", "b"], "reclaim": "any"},
                      "co_inf": {"members": [{"team": "b", "nominal_gpus": 1}], "pool": "inf", "reclaim": "any"}},
                     n1=3, n2=1, n2_type="A100-40GB")
    rules = policy_from_dict(raw).rules
    s = Scheduler(rules, reference=reference)
    s.handle([_sub(0, "V1", "training", "b", runtime_estimate_s=10000, checkpointable=True),
              _sub(0, "V2", "training", "b", runtime_estimate_s=10000, checkpointable=True),
              _sub(0, "A1", "training", "a", runtime_estimate_s=10000)])
    assert s.handle([_sub(1000, "P", "training", "a", runtime_estimate_s=1000)]) == []
    out = s.handle([_sub(2000, "X", "batch", "b", runtime_estimate_s=1000)])
    assert [d.preemptor for d in out if isinstance(d, Preempt)] == ["P"]
    assert s.handle([Tick(2000)]) == []
    restored = Scheduler.restore(rules, json.loads(json.dumps(s.snapshot())), reference=reference)
    assert restored.handle([Tick(2000)]) == []

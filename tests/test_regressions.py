"""Faults found by trying to break the policy engine with hostile input (each was a
hang, a crash, a silent wrong answer or a misleading message before its fix)."""

import pytest

from builders import job, node, policy_dict
from gpushepherd.core.scheduler import SpecError, validate_spec
from gpushepherd.policy import PolicyError, policy_from_dict
from gpushepherd.sim.engine import SimJob, Simulator
from gpushepherd.sim.scenario import ScenarioError, ScenarioSpec, validate_scenario


@pytest.mark.parametrize("priority, gpus_low", [
    ({"weights": {"time_limit": 2_000_000.0}, "max_time_limit_s": 1000}, 1),
    ({"weights": {"size": 1e7}}, 2),
])
def test_a_victim_ranked_above_its_preemptor_does_not_take_the_gpus_back(priority, gpus_low):
    """Weights can rank a lower class first; its victim, requeued, must not restart in
    the preemptor's freed GPUs (this was an endless evict-and-restart loop)."""
    rules = policy_from_dict(policy_dict(nodes=[("n1", gpus_low)], priority=priority)).rules
    jobs = [SimJob(job("R", gpus_low, cls="sandbox", submit=0, runtime_estimate_s=100), 100),
            SimJob(job("I", 1, cls="production-inference", submit=1, time_limit_s=900), 100)]
    sim = Simulator(rules, jobs, check_invariants=True)
    inner, calls = sim.sched.handle, []

    def handle(events):  # the loop happened inside one instant: fail instead of hanging
        calls.append(1)
        assert len(calls) < 200, "evict-and-restart loop"
        return inner(events)

    sim.sched.handle = handle
    res = sim.run()
    assert res.records["I"].starts[0][0] == 1 and res.records["R"].preempted_at == [1.0]
    assert len(res.records["R"].starts) == 2 and res.records["R"].starts[1][0] == 101


@pytest.mark.parametrize("raw, field", [
    ({"priority": {"weights": {"time_limit": float("inf")}}}, "priority.weights.time_limit"),
    ({"priority": {"weights": {"class": float("nan")}}}, "priority.weights.class"),
    ({"prediction": {"enabled": True, "history": 2, "min_jobs": 5}}, "prediction"),
    ({"teams": {"A": {}, "B": {}}, "cohorts": {"c": {"members": [{"team": "A", "nominal_gpus": 3},
                                                               {"team": "B", "nominal_gpus": 3}]}}},
     "cohorts.c.members"),
    ({"teams": {"A": {"max_gpus": 1}}, "cohorts": {"c": {"members": [{"team": "A", "nominal_gpus": 2}]}}},
     "cohorts.c.members[0].nominal_gpus"),
])
def test_policies_that_could_never_work_are_refused(raw, field):
    with pytest.raises(PolicyError) as exc:
        policy_from_dict(policy_dict(nodes=[("n1", 4)], **raw))
    assert field in str(exc.value)


def test_a_pool_cohort_that_counts_no_job_is_refused():
    raw = policy_dict(nodes=[node("a1", 2, pool="a"), node("b1", 2, pool="b")], teams={"A": {}},
                      cohorts={"ca": {"pool": "a", "members": [{"team": "A", "nominal_gpus": 2}]}})
    with pytest.raises(PolicyError) as exc:
        policy_from_dict(raw)
    assert "cohorts.ca.pool" in str(exc.value) and "counts no job" in str(exc.value)


def test_production_inference_cannot_be_made_preemptible():
    rules = policy_from_dict(policy_dict()).rules
    with pytest.raises(SpecError) as exc:
        validate_spec(rules, job("x", 1, cls="production-inference", preemptible=True))
    assert "preemptible" in str(exc.value) and "never preempted" in str(exc.value)


def _cohort(nominal_a, nominal_b, gpus):
    return policy_from_dict(policy_dict(nodes=[("n1", gpus)], teams={"A": {"nominal_gpus": nominal_a},
                                                                     "B": {"nominal_gpus": nominal_b}},
                                        cohorts={"c": {"members": ["A", "B"]}})).rules


def test_a_job_is_never_reclaimed_in_the_instant_it_was_placed():
    jobs = [SimJob(job("B0", 1, team="B", submit=0), 10), SimJob(job("A0", 1, team="A", submit=0), 1000),
            SimJob(job("A2", 1, cls="sandbox", team="A", submit=1), 100),
            SimJob(job("B2", 1, cls="sandbox", team="B", submit=2), 100)]
    res = Simulator(_cohort(1, 1, 2), jobs, check_invariants=True).run()
    a2 = res.records["A2"]
    assert a2.starts[0][0] == 10 and 10.0 not in a2.preempted_at


def test_a_reclaimed_victim_is_not_told_it_waits_for_a_preemptor_that_started():
    jobs = [SimJob(job("B1", 2, cls="training", team="B", submit=0, preemptible=True, checkpointable=True), 1000),
            SimJob(job("A1", 2, team="A", submit=10), 100)]
    res = Simulator(_cohort(2, 0, 2), jobs, record_reasons=True).run()
    assert res.records["A1"].starts[0][0] == 10
    # A1 is within team A's nominal quota: B1 (higher class, but borrowing) may not evict it
    # (nor may any job that would borrow evict another member's: issue 20's loop)
    assert [r[2] for r in res.records["B1"].reasons] == [
        "NoPreemptibleVictims(B would borrow beyond its nominal 0 in cohorts.c: other members' jobs are not "
        "preempted to borrow)"]


def test_a_variant_policy_is_checked_before_anything_runs():
    spec = ScenarioSpec.model_validate({
        "scenario": "v", "policy": policy_dict(nodes=[("n1", 1)]),
        "jobs": [{"id": "A", "class": "batch", "submit": 0, "duration": 1}], "expect": {},
        "variants": [{"name": "bad", "policy": {"preemption": {"enabled": "maybe"}}, "expect": {}},
                     {"name": "id", "jobs": {"A": {"id": "B"}}, "expect": {}}]})
    with pytest.raises(ScenarioError) as exc:
        validate_scenario(spec, "f.yaml")
    assert "variants[0].policy" in str(exc.value)
    spec.variants.pop(0)
    with pytest.raises(ScenarioError) as exc:
        validate_scenario(spec, "f.yaml")
    assert "variants[0].jobs.A.id" in str(exc.value)

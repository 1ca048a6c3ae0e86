"""Deadline ordering (issue 17 point 3, note 034): ``priority.weights.deadline`` and
``priority.deadline_horizon_s`` - least slack first among jobs at risk."""

from __future__ import annotations

import pytest
from builders import job, policy, policy_dict, simulate

from gpushepherd.policy import PolicyError, policy_from_dict


def _rules(weight: float, horizon: float = 200.0):
    return policy(nodes=[("n1", 1)], preemption=False,
                  priority={"weights": {"deadline": weight}, "recalc_s": 10.0, "deadline_horizon_s": horizon})


def _first_starts(rules, jobs) -> dict[str, float]:
    res = simulate(rules, jobs)
    return {k: r.starts[0][0] for k, r in res.records.items() if r.starts}


# one GPU: X runs 0-50; A (no deadline) is ahead of D (deadline 240, needs 100)
JOBS = [(job("X", 1, "batch", "t", 0, runtime_estimate_s=50.0), 50.0),
        (job("A", 1, "batch", "t", 1, runtime_estimate_s=100.0), 100.0),
        (job("D", 1, "batch", "t", 2, runtime_estimate_s=100.0, deadline=240.0), 100.0)]


def test_a_job_at_risk_of_missing_its_deadline_goes_before_one_without():
    # without the factor D starts at 150 and ends at 250, after its deadline; with it, D's
    # slack (240 - 50 - 100 = 90 s, inside the 200 s horizon) puts it first: 50-150
    assert _first_starts(_rules(0.0), JOBS) == {"X": 0.0, "A": 50.0, "D": 150.0}
    assert _first_starts(_rules(1_000_000.0), JOBS) == {"X": 0.0, "A": 150.0, "D": 50.0}


def test_a_job_with_slack_to_spare_or_none_left_is_not_lifted():
    # horizon 50 s: D's slack of 90 s is not at risk yet at 50 -> A first
    assert _first_starts(_rules(1_000_000.0, horizon=50.0), JOBS)["A"] == 50.0
    # a deadline D can no longer make (needs 100 s, 60 s left at 50): no boost
    late = [JOBS[0], JOBS[1], (job("D", 1, "batch", "t", 2, runtime_estimate_s=100.0, deadline=110.0), 100.0)]
    assert _first_starts(_rules(1_000_000.0), late) == {"X": 0.0, "A": 50.0, "D": 150.0}


def test_the_least_slack_goes_first():
    jobs = [JOBS[0], (job("D1", 1, "batch", "t", 1, runtime_estimate_s=100.0, deadline=300.0), 100.0),
            (job("D2", 1, "batch", "t", 2, runtime_estimate_s=100.0, deadline=260.0), 100.0)]
    starts = _first_starts(_rules(1_000_000.0), jobs)
    assert starts["D2"] == 50.0 and starts["D1"] == 150.0


def test_a_job_at_risk_never_passes_production_inference():
    jobs = [JOBS[0], (job("P", 1, "production-inference", "t", 1, runtime_estimate_s=100.0), 100.0),
            (job("D", 1, "batch", "t", 2, runtime_estimate_s=100.0, deadline=240.0), 100.0)]
    # a weight far above the class term: still P first
    rules = policy(nodes=[("n1", 1)], preemption=False,
                   priority={"weights": {"deadline": 10_000_000.0}, "recalc_s": 10.0, "deadline_horizon_s": 200.0})
    starts = _first_starts(rules, jobs)
    assert starts["P"] == 50.0 and starts["D"] == 150.0


@pytest.mark.parametrize("value", [0, -5, "soon"])
def test_a_horizon_that_is_not_a_positive_number_of_seconds_is_refused(value):
    raw = policy_dict(nodes=[("n1", 1)])
    raw["priority"] = {"weights": {"deadline": 1000.0}, "deadline_horizon_s": value}
    with pytest.raises(PolicyError) as err:
        policy_from_dict(raw)
    assert "priority.deadline_horizon_s" in str(err.value)

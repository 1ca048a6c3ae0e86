"""Every scenario under examples/scenarios/ runs and meets its expectations."""

from pathlib import Path

import pytest

from gpushepherd.sim.scenario import Expect, check_expect, load_scenario, run_scenario

SCENARIOS = sorted((Path(__file__).resolve().parent.parent / "examples" / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path):
    outcomes = run_scenario(load_scenario(path), str(path))
    for o in outcomes:
        assert o.passed, f"{o.name}: " + "; ".join(o.failures)


def test_issue_two_scenarios_are_present():
    names = {p.stem for p in SCENARIOS}
    assert {"S05", "S09", "S10", "S16", "S27", "S28", "S33-A", "S33-B"} <= names


def test_a_wrong_expectation_is_reported():
    """The checker is not a rubber stamp: shifted times, nodes and reasons all fail."""
    path = next(p for p in SCENARIOS if p.stem == "S16")
    result = run_scenario(load_scenario(path), str(path))[0].result
    wrong = Expect.model_validate({
        "starts": {"T2": {"t": 999, "node": "n2"}},
        "ends": {"T3": 1101},
        "pending": {"T3": {"from": 20, "to": 1000, "reason": "Resources"}},
        "preempted": {"T1": [5]},
        "team_usage": {"T": [[0, 4]]},
    })
    fails = check_expect(result, wrong)
    joined = "\n".join(fails)
    assert "T2: start #1 at t=1000, expected t=999" in joined
    assert "T2: start #1 on n1, expected n2" in joined
    assert "T3: ended at 1100" in joined
    assert "T3: pending for QuotaExceeded" in joined
    assert "T1: preempted at []" in joined
    assert "team T: usage over time" in joined

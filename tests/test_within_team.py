"""Preemption within a team's own quota (issue 13 point 2, note 035):
``teams.T.preemption.within_team: never | lower_priority`` (Kueue ``withinClusterQueue``)."""

from __future__ import annotations

import pytest
from builders import job, policy, policy_dict, simulate

from gpushepherd.policy import PolicyError, policy_from_dict


def _run(teams: dict, preemption: bool = True, extra=()):
    rules = policy(nodes=[("n1", 4)], preemption={"enabled": preemption, "min_runtime_s": 0.0}, teams=teams,
                   classes={"sandbox": {"grace_period_s": 5.0}})
    jobs = [(job("S", 2, "sandbox", "a", 0), 100.0), (job("B", 1, "sandbox", "b", 0), 100.0),
            (job("T", 2, "training", "a", 10), 50.0), *extra]
    res = simulate(rules, jobs)
    return {k: ([t for t, _ in r.starts], r.preempted_at) for k, r in res.records.items()}


@pytest.mark.parametrize("preemption", [True, False])
def test_a_job_held_back_by_its_teams_limit_preempts_the_teams_lower_class_job(preemption):
    # team a may hold 2 GPUs; S (sandbox) holds them, B (team b) 1, 1 GPU free. T (training,
    # team a) waits only for a's limit: it preempts S (grace 5 s) and starts at 15 on its GPUs.
    # B, whose eviction would free no quota of a, is left alone - with class preemption on
    # or off (within-team preemption is the team's own setting)
    got = _run({"a": {"max_gpus": 2, "preemption": {"within_team": "lower_priority"}}, "b": {}}, preemption)
    assert got["S"] == ([0.0, 65.0], [10.0])
    assert got["T"] == ([15.0], [])
    assert got["B"] == ([0.0], [])


def test_off_by_default_the_job_waits_for_its_team():
    got = _run({"a": {"max_gpus": 2}, "b": {}})
    assert got["T"] == ([100.0], []) and got["S"] == ([0.0], [])


def test_a_limit_of_a_team_that_does_not_allow_it_binding_too_preempts_nothing():
    # d (a's child) has max_gpus 2 of its own and no within_team; a allows it. T of d is held
    # back by d's limit: no victim inside a may start it
    teams = {"a": {"max_gpus": 4, "preemption": {"within_team": "lower_priority"}}, "d": {"parent": "a",
                                                                                          "max_gpus": 2}}
    rules = policy(nodes=[("n1", 4)], preemption={"enabled": False, "min_runtime_s": 0.0}, teams=teams,
                   classes={"sandbox": {"grace_period_s": 5.0}})
    res = simulate(rules, [(job("S", 2, "sandbox", "d", 0), 100.0), (job("T", 2, "training", "d", 10), 50.0)])
    assert res.records["S"].preempted_at == [] and res.records["T"].starts[0][0] == 100.0


def test_a_parent_teams_limit_lets_a_child_preempt_a_sibling_teams_lower_class_job():
    # ml (max 2 GPUs, within_team) has children a and b: a's T is held back by ml's limit,
    # b's sandbox job counts in it and is the victim
    teams = {"ml": {"max_gpus": 2, "preemption": {"within_team": "lower_priority"}},
             "a": {"parent": "ml"}, "b": {"parent": "ml"}}
    rules = policy(nodes=[("n1", 4)], preemption={"enabled": False, "min_runtime_s": 0.0}, teams=teams,
                   classes={"sandbox": {"grace_period_s": 5.0}})
    res = simulate(rules, [(job("V", 2, "sandbox", "b", 0), 100.0), (job("T", 2, "training", "a", 10), 50.0)])
    assert res.records["V"].preempted_at == [10.0] and res.records["T"].starts[0][0] == 15.0


def test_a_job_of_the_same_or_a_higher_class_is_never_a_victim():
    teams = {"a": {"max_gpus": 2, "preemption": {"within_team": "lower_priority"}}}
    rules = policy(nodes=[("n1", 4)], preemption={"enabled": False, "min_runtime_s": 0.0}, teams=teams)
    res = simulate(rules, [(job("S", 2, "training", "a", 0), 100.0), (job("T", 2, "training", "a", 10), 50.0)])
    assert res.records["S"].preempted_at == [] and res.records["T"].starts[0][0] == 100.0


def test_a_within_team_value_that_is_not_one_is_refused_naming_the_field():
    raw = policy_dict(nodes=[("n1", 4)], teams={"a": {"preemption": {"within_team": "LowerPriority"}}})
    with pytest.raises(PolicyError) as err:
        policy_from_dict(raw)
    text = str(err.value)
    assert "teams.a.preemption.within_team" in text and "lower_priority" in text and "never" in text

"""Quotas per GPU type (issue 13 point 4, note 038): ``max_gpus``, ``nominal_gpus``,
``borrowing_limit`` and ``lending_limit`` as a number (every type) or per GPU type."""

from __future__ import annotations

import pytest
from builders import job, node, policy, policy_dict, scheduler, simulate, submit

from gpushepherd.cli.policy import summary
from gpushepherd.policy import PolicyError, policy_from_dict

NODES = [node("h1", 4, "H100-80GB"), node("a1", 4, "A100-80GB")]


def _error(teams: dict, cohorts: dict | None = None, nodes=NODES) -> str:
    raw = policy_dict(nodes, teams=teams, **({"cohorts": cohorts} if cohorts else {}))
    with pytest.raises(PolicyError) as exc:
        policy_from_dict(raw)
    return str(exc.value)


@pytest.mark.parametrize("teams, cohorts, path, fragment", [
    ({"ml": {"max_gpus": {"B200": 2}}}, None, "teams.ml.max_gpus[B200]", "A100-80GB, H100-80GB"),
    ({"ml": {"max_gpus": {"H100-80GB": -1}}}, None, "teams.ml.max_gpus", "for H100-80GB: input should be greater"),
    ({"ml": {"max_gpus": {}}}, None, "teams.ml.max_gpus", "0 GPU types"),
    ({"ml": {"max_gpus": {"H100-80GB": 1.5}}}, None, "teams.ml.max_gpus", "not a whole number"),
    ({"ml": {"nominal_gpus": {"H100-80GB": 3}, "max_gpus": {"H100-80GB": 2}}}, None,
     "teams.ml.nominal_gpus[H100-80GB]", "at most the team's max_gpus[H100-80GB] (2)"),
    ({"ml": {"nominal_gpus": {"H100-80GB": 3}}, "cv": {"nominal_gpus": {"H100-80GB": 2}}}, None,
     "teams.*.nominal_gpus[H100-80GB]", "the cluster's 4 H100-80GB GPUs"),
    ({"ml": {"nominal_gpus": {"H100-80GB": 1}, "lending_limit": {"H100-80GB": 2}}, "cv": {}},
     {"c": {"members": ["ml", "cv"]}}, "teams.ml.lending_limit[H100-80GB]", "at most the team's nominal_gpus"),
    ({"ml": {"nominal_gpus": {"H100-80GB": 1}}, "cv": {"nominal_gpus": 1}}, {"c": {"members": ["ml", "cv"]}},
     "teams.cv.nominal_gpus", "all per GPU type or all in GPUs"),
    ({"ml": {"nominal_gpus": 1}}, {"c": {"members": [{"team": "ml", "borrowing_limit": {"X1": 1}}]}},
     "cohorts.c.members[0].borrowing_limit[X1]", "a GPU type of the cluster's nodes"),
    ({"ml": {"max_gpus": {"H100-80GB": 2}, "windows": [{"max_gpus": 1}]}}, None, "teams.ml.windows",
     "no max_gpus in windows"),
])
def test_a_bad_per_type_quota_names_the_field_the_value_and_what_is_allowed(teams, cohorts, path, fragment):
    text = _error(teams, cohorts)
    assert f": {path}: " in text and fragment in text, text


def test_a_plain_number_compiles_to_the_limits_it_always_did():
    teams = {"ml": {"nominal_gpus": 2, "max_gpus": 6, "borrowing_limit": 2, "lending_limit": 1}, "cv": {}}
    rules = policy(NODES, teams=teams, cohorts={"c": {"members": ["ml", "cv"]}})
    assert not rules.typed and all(lim.gpu_type is None for lim in rules.limits)
    assert [lim.path for lim in rules.limits if lim.cohort] == ["cohorts.c", "cohorts.c(keeping ml lending_limit)"]
    assert next(lim.max for lim in rules.limits if lim.path == "cohorts.c") == 2  # the sum of nominal quotas


def test_a_cohort_per_type_counts_the_gpus_no_member_is_guaranteed():
    teams = {"ops": {"nominal_gpus": {"H100-80GB": 1}}, "cv": {"nominal_gpus": {"H100-80GB": 1}},
             "nlp": {"nominal_gpus": {"H100-80GB": 1}, "borrowing_limit": {"H100-80GB": 2}}}
    rules = policy(NODES, teams=teams, cohorts={"c": {"members": ["cv", "nlp"]}})
    # only the type a member names; 4 H100s less ops' 1: 3, of which members are guaranteed 2
    assert sorted(rules.cohorts) == ["c[H100-80GB]"]
    caps = {lim.path: lim.max for lim in rules.limits if lim.cohort}
    assert caps == {"cohorts.c[H100-80GB]": 3}
    assert "cohort c[H100-80GB]: capacity 3 GPUs, 2 guaranteed to members (cv 1, nlp 1), 1 to none" in summary(rules)
    assert "team nlp: nominal_gpus[H100-80GB]=1, borrowing_limit[H100-80GB]=3, " \
           "nominal_gpus[H100-80GB](not preemptible)=1" in summary(rules)


def _starts(res) -> dict:
    return {k: ([t for t, _ in r.starts], r.preempted_at) for k, r in res.records.items()}


def test_a_job_refused_by_one_types_quota_starts_on_another_and_is_charged_there():
    rules = policy(NODES, teams={"ml": {"max_gpus": {"H100-80GB": 2, "A100-80GB": 2}}}, preemption=False)
    res = simulate(rules, [(job("H", 2, team="ml", submit=0, gpu_types=("H100-80GB",)), 100.0),
                           (job("X", 2, team="ml", submit=1), 50.0),   # H100 quota used: on a1
                           (job("Y", 1, team="ml", submit=2), 10.0)])  # both quotas used: waits for X
    got = _starts(res)
    assert got["X"][0] == [1.0] and res.records["X"].starts[0][1].parts[0][0] == "a1"
    assert got["Y"][0] == [51.0] and res.records["Y"].starts[0][1].parts[0][0] == "a1"


def test_a_team_under_its_h100_nominal_reclaims_h100s_not_a100s():
    # nlp borrows all 4 H100s (cv's 2 guaranteed ones and 2 no one's) and 4 A100s (2 its own);
    # cv needs 2 H100s back: nlp's H100 job is reclaimed, its A100 job is left alone (cv has
    # no A100 guarantee to reclaim)
    teams = {"cv": {"nominal_gpus": {"H100-80GB": 2}}, "nlp": {"nominal_gpus": {"A100-80GB": 2}}}
    rules = policy(NODES, teams=teams, cohorts={"c": {"members": ["cv", "nlp"]}},
                   preemption={"enabled": True, "min_runtime_s": 0.0})
    res = simulate(rules, [
        (job("NH", 4, team="nlp", submit=0, gpu_types=("H100-80GB",), checkpointable=False), 100.0),
        (job("NA", 4, team="nlp", submit=0, gpu_types=("A100-80GB",), checkpointable=False), 100.0),
        (job("C", 2, team="cv", submit=10, gpu_types=("H100-80GB",)), 20.0),
        (job("CA", 2, team="cv", submit=11, gpu_types=("A100-80GB",)), 20.0)])
    got = _starts(res)
    assert got["NH"][1] == [10.0] and got["NA"] == ([0.0], [])
    assert got["C"][0] == [10.0]
    assert got["CA"][0] == [100.0]  # no A100 reclaim for cv: it waits for NA


def test_a_job_of_several_types_reclaims_on_the_type_it_is_guaranteed():
    # as above, with 8 A100s of which ops (outside the cohort) is guaranteed 4: the cohort's
    # A100 capacity is 4, all held by NA. C may run on either type: on A100 4 GPUs are free
    # but the cohort is full and cv has no A100 guarantee (CohortQuota, nothing to reclaim);
    # on H100 no GPU is free but cv may reclaim its 2: it does, on h1
    teams = {"cv": {"nominal_gpus": {"H100-80GB": 2}}, "nlp": {"nominal_gpus": {"A100-80GB": 2}},
             "ops": {"nominal_gpus": {"A100-80GB": 4}}}
    rules = policy([node("h1", 4, "H100-80GB"), node("a1", 8, "A100-80GB")], teams=teams,
                   cohorts={"c": {"members": ["cv", "nlp"]}},
                   preemption={"enabled": True, "min_runtime_s": 0.0})
    res = simulate(rules, [
        (job("NH", 4, team="nlp", submit=0, gpu_types=("H100-80GB",), checkpointable=False), 100.0),
        (job("NA", 4, team="nlp", submit=0, gpu_types=("A100-80GB",), checkpointable=False), 100.0),
        (job("C", 2, team="cv", submit=10), 20.0)])
    got = _starts(res)
    assert got["NH"][1] == [10.0] and got["NA"] == ([0.0], [])
    assert got["C"][0] == [10.0] and res.records["C"].starts[0][1].parts[0][0] == "h1"


def test_the_estimated_start_of_a_job_of_several_types_is_its_earliest_over_them():
    # ml's H100s are held until 100, its A100s until 50: Y (either type) starts at 50 on
    # the A100s, though 2 H100s are free now (ml may not use them) and o's Z frees an A100
    # at 20 (an estimate blind to the types would say 20)
    rules = policy(NODES, teams={"ml": {"max_gpus": {"H100-80GB": 2, "A100-80GB": 2}}, "o": {}}, preemption=False)
    sched, _out = scheduler(rules, job("H", 2, team="ml", gpu_types=("H100-80GB",), time_limit_s=100.0),
                            job("X", 2, team="ml", time_limit_s=50.0),
                            job("Z", 1, team="o", gpu_types=("A100-80GB",), time_limit_s=20.0))
    sched.handle(submit(job("Y", 2, team="ml", submit=1, time_limit_s=10.0)))
    assert sched.estimated_start("Y") == 50.0
    assert str(sched.pending_reason("Y")) == "QuotaExceeded(teams.ml.max_gpus[H100-80GB]=2, in use 2)"

"""NVLink islands as a requirement and as a preference (issue 13 point 5, note 037)."""

import pytest

from gpushepherd.core.intake import SpecError, validate_spec
from gpushepherd.model.job import JobSpec
from gpushepherd.policy.load import policy_from_dict
from gpushepherd.sim.scenario import ScenarioSpec, run_scenario, validate_scenario

NODE = {"name": "n1", "gpus": 8, "gpu_type": "H100-80GB", "nvlink_islands": [[0, 1, 2, 3], [4, 5, 6, 7]]}


def _run(raw: dict):
    spec = ScenarioSpec.model_validate(raw)
    validate_scenario(spec)
    outcomes = run_scenario(spec)
    for o in outcomes:
        assert o.passed, f"{o.name}: " + "; ".join(o.failures)
    return outcomes


def test_equal_cost_victims_keep_the_preemptor_on_one_island():
    """Two victim sets of two batch jobs each: {A3, A2} comes first in victim order but
    leaves 0,1,3 and 4,5 (no island of four); {A2, A1} frees island 4-7: at equal cost
    the island wins over victim order, with or without the requirement."""
    for require in (False, True):
        _run({
            "scenario": "equal-cost",
            "policy": {"cluster": {"nodes": [NODE]}, "classes": {"batch": {"grace_period_s": 0}}},
            "initial_allocations": [
                {"job": "F", "team": "T", "class": "training", "node": "n1", "gpus": 1, "gpu_indices": [2],
                 "ends": 100000, "preemptible": False},
                *({"job": name, "team": "T", "class": "batch", "node": "n1", "gpus": 2, "gpu_indices": gpus,
                   "ends": 100000} for name, gpus in (("A3", [0, 1]), ("A2", [4, 5]), ("A1", [6, 7]))),
            ],
            "jobs": [{"id": "P", "team": "T", "class": "training", "submit": 10, "gpus": 4, "duration": 100,
                      "time_limit": 100, "require_island": require}],
            "expect": {"starts": {"P": {"t": 10, "node": "n1", "gpus": [4, 5, 6, 7]}},
                       "preempted": {"A2": [10], "A1": [10]}, "never_preempted": ["A3", "F"]},
        })


def test_the_reservation_is_planned_on_an_island():
    """E3 frees GPU 2 at 50 (four free by count: 2,3,6,7, two islands), E1 frees 0,1 at
    100 (island 0-3 whole). R (4 GPUs, require_island) is planned at 100, not 50, so B (1
    GPU, limit 60) backfills at 20 - on GPU 3, the tighter island - and ends at 80
    before R needs it; R runs 100-150 on 0-3. A count-only plan would have kept B
    waiting as ReservedFor(R) until 50. R waits for GPUs (fewer than 4 free) until 80,
    then for an island (2,3,6,7 free)."""
    _run({
        "scenario": "island-reservation",
        "policy": {"cluster": {"nodes": [NODE]}, "classes": {"batch": {"require_island": True}},
                   "preemption": {"enabled": False}},
        "initial_allocations": [
            {"job": "E1", "team": "T", "class": "batch", "node": "n1", "gpus": 2, "gpu_indices": [0, 1], "ends": 100},
            {"job": "E3", "team": "T", "class": "batch", "node": "n1", "gpus": 1, "gpu_indices": [2], "ends": 50},
            {"job": "E2", "team": "T", "class": "batch", "node": "n1", "gpus": 2, "gpu_indices": [4, 5], "ends": 200},
        ],
        "jobs": [{"id": "R", "team": "T", "class": "batch", "submit": 10, "gpus": 4, "duration": 50, "time_limit": 50},
                 {"id": "B", "team": "T", "class": "batch", "submit": 20, "gpus": 1, "duration": 60, "time_limit": 60}],
        "expect": {"starts": {"R": {"t": 100, "gpus": [0, 1, 2, 3]}, "B": {"t": 20, "gpus": [3]}},
                   "ends": {"R": 150, "B": 80},
                   "pending": {"R": [{"from": 10, "to": 80, "reason": "Resources"},  # 3 free GPUs, or 2
                                     {"from": 80, "to": 100, "reason": "NoFit(nvlink-island)"}]}},
    })


def test_a_node_without_islands_is_one_island():
    """A node that declares no islands holds a required job of all its GPUs."""
    _run({
        "scenario": "no-islands",
        "policy": {"cluster": {"nodes": [{"name": "n1", "gpus": 8, "gpu_type": "H100-80GB"}]},
                   "classes": {"batch": {"require_island": True}}},
        "jobs": [{"id": "R", "team": "T", "class": "batch", "submit": 0, "gpus": 8, "duration": 10}],
        "expect": {"starts": {"R": {"t": 0, "gpus": [0, 1, 2, 3, 4, 5, 6, 7]}}, "ends": {"R": 10}},
    })


def test_require_island_with_a_gang_of_pods_is_refused():
    rules = policy_from_dict({"cluster": {"nodes": [NODE]}}).rules
    spec = JobSpec(id="g", team="T", workload_class="batch", gpus=4, gpus_per_pod=2, require_island=True)
    with pytest.raises(SpecError, match=r"require_island: True is not allowed with gpus_per_pod \(2\)"):
        validate_spec(rules, spec)
    validate_spec(rules, JobSpec(id="g", team="T", workload_class="batch", gpus=4, gpus_per_pod=2))


def test_class_require_island_must_be_a_boolean():
    with pytest.raises(Exception, match="require_island"):
        policy_from_dict({"cluster": {"nodes": [NODE]}, "classes": {"batch": {"require_island": "often"}}})
    rules = policy_from_dict({"cluster": {"nodes": [NODE]}, "classes": {"batch": {"require_island": True}}}).rules
    assert rules.classes["batch"].require_island and not rules.classes["training"].require_island


def test_no_preemptible_victims_is_not_said_when_only_an_island_is_missing():
    """F and G (production inference, as P) hold GPUs 2 and 5; the batch jobs on 0,1 and
    4,6,7 may be evicted by P (production inference, 4 GPUs, require_island), but no
    island of 0-3 or 4-7 can be whole while F and G run: evicting every lower job would
    free 6 GPUs of n1, none 4 inside one island. P waits for GPUs (Resources), not for
    victims that may not be evicted (NoPreemptibleVictims), and nobody is preempted."""
    _run({
        "scenario": "island-victims-none",
        "policy": {"cluster": {"nodes": [NODE]}, "classes": {"batch": {"grace_period_s": 0}}},
        "initial_allocations": [
            {"job": "F", "team": "T", "class": "production-inference", "node": "n1", "gpus": 1,
             "gpu_indices": [2], "ends": 1000},
            {"job": "G", "team": "T", "class": "production-inference", "node": "n1", "gpus": 1,
             "gpu_indices": [5], "ends": 1000},
            {"job": "A", "team": "T", "class": "batch", "node": "n1", "gpus": 2, "gpu_indices": [0, 1], "ends": 1000},
            {"job": "B", "team": "T", "class": "batch", "node": "n1", "gpus": 3, "gpu_indices": [4, 6, 7],
             "ends": 1000},
        ],
        "jobs": [{"id": "P", "team": "T", "class": "production-inference", "submit": 10, "gpus": 4,
                  "require_island": True, "duration": 10}],
        "expect": {"starts": {"P": {"t": 1000, "gpus": [0, 1, 2, 3]}}, "never_preempted": ["A", "B"],
                   "pending": {"P": {"from": 10, "to": 1000, "reason": "Resources"}}},
    })


def test_free_gpus_split_across_islands_are_stranded_for_a_required_job():
    """On 6 GPUs in islands 0-2 and 3-5, a and b (2 GPUs each) take 0,1 and 3,4: the two
    free GPUs are one in each island. c (2 GPUs, require_island) cannot use them - they
    are stranded while it waits; without the requirement c takes them."""
    from builders import job, node, policy, scheduler
    from gpushepherd.model.decisions import Start

    rules = policy(nodes=[node("n1", 6, nvlink_islands=[[0, 1, 2], [3, 4, 5]])])
    sched, out = scheduler(rules, job("a", 2), job("b", 2), job("c", 2, submit=1, require_island=True))
    assert {d.job_id: str(d.placement) for d in out if isinstance(d, Start)} == {"a": "n1:0,1", "b": "n1:3,4"}
    assert sched.stranded_capacity()["stranded_gpus"] == 2.0
    sched, out = scheduler(rules, job("a", 2), job("b", 2), job("c", 2, submit=1, require_island=False))
    assert {d.job_id: str(d.placement) for d in out if isinstance(d, Start)}["c"] == "n1:2,5"


def test_the_api_cli_and_kueue_export_carry_require_island(tmp_path):
    from gpushepherd.cli.daemon import constraint_fields, constraints_text
    from gpushepherd.daemon.api import SubmitBody
    from gpushepherd.daemon.server import constraints_view
    from gpushepherd.policy.kueue import export_kueue

    body = SubmitBody.model_validate({"class": "batch", "team": "T", "gpus": 4, "command": ["true"],
                                      "cwd": str(tmp_path), "require_island": False})
    spec = body.spec()
    assert spec.require_island is False  # false is said, not dropped: it overrides a class that requires one
    assert constraints_view(spec)["require_island"] is False
    assert constraint_fields(require_island=False) == {"require_island": False} and constraint_fields() == {}
    assert constraints_text({"require_island": True}) == "require_island=yes"
    _objects, cannot = export_kueue(policy_from_dict({"cluster": {"nodes": [NODE]},
                                                      "classes": {"batch": {"require_island": True}}}))
    assert any(line.startswith("classes.batch.require_island") for line in cannot)

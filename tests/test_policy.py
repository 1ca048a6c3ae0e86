"""The policy file: valid examples load; every malformed policy gives one clear error."""

from pathlib import Path

import pytest

from gpushepherd.policy import PolicyError, load_policy, override_cluster, parse_policy, policy_from_dict

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = {"nodes": [{"name": "n", "count": 2, "gpus": 8}]}


def test_examples_load():
    small = load_policy(ROOT / "examples/policies/small-team.yaml").rules
    assert sum(n.gpus for n in small.nodes) == 8
    assert small.classes["production-inference"].reserved_gpus == 2
    paths = {lim.path: lim.max for lim in small.limits}
    assert paths["classes.training.max_gpus"] == 4
    assert paths["classes.batch.max_gpus"] == 2
    assert paths["classes.sandbox.max_gpus_per_user"] == 1
    philly = load_policy(ROOT / "examples/policies/philly.yaml").rules
    assert len(philly.nodes) == 352 and philly.nodes[0].name == "node-001" and philly.nodes[-1].name == "node-352"


def test_standard_classes_have_r1_defaults_and_overrides_merge():
    rules = policy_from_dict({"cluster": CLUSTER, "classes": {"batch": {"max_runtime_s": 3600}}}).rules
    assert rules.classes["batch"].priority == 200 and rules.classes["batch"].max_runtime_s == 3600
    assert rules.classes["production-inference"].preemptible is False
    assert rules.classes["training"].preempt_only_if_checkpointable is True
    assert [c.priority for c in sorted(rules.classes.values(), key=lambda c: -c.priority)] == [400, 300, 250, 200, 100]


def _error(raw) -> str:
    with pytest.raises(PolicyError) as info:
        policy_from_dict(raw, "p.yaml")
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith("p.yaml: ")
    return text


@pytest.mark.parametrize("raw, path, fragment", [
    ({"cluster": CLUSTER, "teams": {"ml": {"max_gpus": -1}}}, "teams.ml.max_gpus", "-1 is not allowed"),
    ({"cluster": {"nodes": [{"name": "n", "gpus": 0}]}}, "cluster.nodes[0].gpus", "0 is not allowed"),
    ({"cluster": CLUSTER, "teams": {"ml": {"classes": {"trainnig": {"max_gpus": 2}}}}},
     "teams.ml.classes.trainnig", "a workload class: batch, production-inference"),
    ({"cluster": CLUSTER, "classes": {"gpu-hogs": {"max_gpus": 2}}}, "classes.gpu-hogs.priority", "priority"),
    ({"cluster": CLUSTER, "teams": {"a": {"nominal_gpus": 10}, "b": {"nominal_gpus": 10}}},
     "teams.*.nominal_gpus", "at most the cluster's 16 GPUs"),
    ({"cluster": CLUSTER, "teams": {"a": {"max_gpus": 4, "nominal_gpus": 6}}}, "teams.a", "nominal_gpus <= max_gpus"),
    ({"cluster": CLUSTER, "teams": {"a": {"parent": "nobody"}}}, "teams.a.parent", "'nobody' is not allowed"),
    ({"cluster": CLUSTER, "teams": {"a": {"parent": "b"}, "b": {"parent": "a"}}}, "teams.a.parent", "without cycles"),
    ({"cluster": CLUSTER, "teams": {"ml": {"max_gpu": 3}}}, "teams.ml.max_gpu", "unknown field; allowed fields here:"),
    ({"cluster": {"nodes": [{"name": "n", "gpus": 2}, {"name": "n", "gpus": 2}]}}, "cluster.nodes[1].name", "used once"),
    ({"cluster": {"nodes": [{"name": "n", "gpus": 2, "pool": "x"}], "pools": [{"name": "y"}]}},
     "cluster.nodes[0].pool", "one of the pools"),
    ({"cluster": CLUSTER, "classes": {"sandbox": {"pools": ["dev"]}}}, "classes.sandbox.pools", "a pool of the cluster"),
    ({"cluster": CLUSTER, "classes": {"production-inference": {"reserved_gpus": 20}}}, "classes.*.reserved_gpus", "16"),
    ({"teams": {}}, "cluster", "a value is required"),
])
def test_malformed_policy_names_path_value_and_what_is_allowed(raw, path, fragment):
    text = _error(raw)
    assert f": {path}: " in text
    assert fragment in text


def test_time_window_is_an_error_that_says_so():
    raw = {"cluster": CLUSTER, "classes": {"batch": {"max_gpus_by_window": [{"from": "08:00", "to": "20:00", "max": 2}]}}}
    text = _error(raw)
    assert "classes.batch.max_gpus_by_window" in text and "time windows" in text and "not supported yet" in text


def test_yaml_syntax_error_is_one_line():
    with pytest.raises(PolicyError) as info:
        parse_policy("cluster: {nodes: [\n", "bad.yaml")
    assert "bad.yaml: line" in str(info.value) and "valid YAML" in str(info.value)


def test_not_a_mapping():
    assert "a YAML mapping" in _error(["cluster"])


def test_cluster_override():
    raw = override_cluster({"cluster": CLUSTER}, "4x2:A100-80GB:81920")
    rules = policy_from_dict(raw).rules
    assert [(n.gpus, n.gpu_type, n.gpu_mem_mib) for n in rules.nodes] == [(2, "A100-80GB", 81920)] * 4
    for bad in ("4", "x8", "0x8", "4x0", "ax8", "4x8:T:-1", "4x8:a:b:c"):
        with pytest.raises(PolicyError):
            override_cluster({"cluster": CLUSTER}, bad)

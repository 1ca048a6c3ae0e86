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
    ({"cluster": CLUSTER, "teams": {"a": {"max_gpus": 4, "nominal_gpus": 6}}}, "teams.a.nominal_gpus",
     "at most the team's max_gpus (4)"),
    ({"cluster": CLUSTER, "teams": {"a": {"max_gpus": True}}}, "teams.a.max_gpus", "True is not allowed"),
    ({"cluster": {"nodes": [{"name": "n", "gpus": 10**9}]}}, "cluster.nodes[0].gpus", "less than or equal to 256"),
    ({"cluster": {"nodes": [{"name": "n", "gpus": 8, "count": 10**7}]}}, "cluster.nodes[0].count", "100000"),
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


@pytest.mark.parametrize("text, fragment", [
    ("cluster: {nodes: [{name: n, gpus: 8}]}\nteams: {a: {}, a: {max_gpus: 1}}\n", "key 'a' appears twice"),
    ("cluster: &a {nodes: [{name: n, gpus: 8}], me: *a}\n", "recursive alias"),
    ("l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"l{i}: &l{i} [*l{i-1}, *l{i-1}, *l{i-1}, *l{i-1}, *l{i-1}, *l{i-1}, *l{i-1}, *l{i-1}, *l{i-1}, *l{i-1}]\n"
        for i in range(1, 9)) + "cluster: {nodes: [{name: n, gpus: 8}]}\n", "more than 1,000,000 nodes"),
])
def test_yaml_traps_are_one_line_errors(text, fragment):
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml")
    assert str(info.value).startswith("p.yaml: ") and fragment in str(info.value)


def test_non_utf8_policy_file(tmp_path):
    p = tmp_path / "latin1.yaml"
    p.write_bytes(b"name: caf\xe9\ncluster: {nodes: [{name: n, gpus: 8}]}\n")
    with pytest.raises(PolicyError, match="not UTF-8 text"):
        load_policy(p)


@pytest.mark.parametrize("raw", [
    {"cluster": CLUSTER, "classes": {"batch": {"max_gpus": {"day": 2, "night": 6}}}},
    {"cluster": CLUSTER, "teams": {"a": {"schedule": [{"from": "08:00", "max_gpus": 2}]}}},
])
def test_other_spellings_of_a_time_window_say_so(raw):
    assert "time windows" in _error(raw)


def test_a_label_called_window_is_no_time_window():
    rules = policy_from_dict({"cluster": {"nodes": [{"name": "n", "gpus": 2, "labels": {"window": "a"}}]}}).rules
    assert rules.nodes[0].labels == (("window", "a"),)


def test_yaml_syntax_error_is_one_line():
    with pytest.raises(PolicyError) as info:
        parse_policy("cluster: {nodes: [\n", "bad.yaml")
    assert "bad.yaml: line" in str(info.value) and "not valid YAML" in str(info.value)


def test_not_a_mapping():
    assert "a YAML mapping" in _error(["cluster"])


def test_cluster_override():
    raw = override_cluster({"cluster": CLUSTER}, "4x2:A100-80GB:81920")
    rules = policy_from_dict(raw).rules
    assert [(n.gpus, n.gpu_type, n.gpu_mem_mib) for n in rules.nodes] == [(2, "A100-80GB", 81920)] * 4
    for bad in ("4", "x8", "0x8", "4x0", "ax8", "4x8:T:-1", "4x8:a:b:c"):
        with pytest.raises(PolicyError):
            override_cluster({"cluster": CLUSTER}, bad)

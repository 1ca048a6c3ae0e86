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
    ({"cluster": CLUSTER, "classes": {"production-inference": {"preemptible": True}}},
     "classes.production-inference.preemptible", "production inference is never preempted"),
    ({"cluster": CLUSTER, "teams": {"ml": {"allowed_classes": ["batch", "trainnig"]}}},
     "teams.ml.allowed_classes[1]", "'trainnig' is not allowed: a workload class: batch, production-inference"),
])
def test_malformed_policy_names_path_value_and_what_is_allowed(raw, path, fragment):
    text = _error(raw)
    assert f": {path}: " in text
    assert fragment in text


def test_time_windows_compile_to_limits_that_change_with_local_time():
    rules = policy_from_dict({
        "cluster": CLUSTER, "clock": {"timezone": "Europe/Berlin", "start": "2026-11-30T07:00:00"},
        "classes": {"batch": {"max_gpus": 2, "on_window_close": "checkpoint-and-stop", "windows": [
            {"name": "night", "from": "20:00", "to": "08:00", "max_gpus": 6},
            {"name": "weekend", "days": ["sat", "sun"], "max_gpus": 6}]}},
    }).rules
    lim = next(li for li in rules.limits if li.path == "classes.batch.max_gpus")
    assert lim.loosest == 6 and rules.classes["batch"].on_window_close == "checkpoint-and-stop"
    hour = 3600.0
    # 2026-11-30 is a Monday; t=0 is 07:00 local time
    assert lim.at(rules.clock, 0) == (6, "night")
    assert lim.at(rules.clock, 1 * hour) == (2, "")          # 08:00 Monday: day
    assert lim.at(rules.clock, 13 * hour) == (6, "night")    # 20:00
    assert lim.at(rules.clock, 5 * 24 * hour + 5 * hour) == (6, "weekend")  # Saturday 12:00
    assert rules.clock.next_boundary(rules.window_boundaries(), 0) == 1 * hour


@pytest.mark.parametrize("raw, path, fragment", [
    ({"cluster": CLUSTER, "teams": {"a": {"windows": [{"from": "25:00", "max_gpus": 1}]}}}, "teams.a.windows[0].from",
     "should match pattern"),
    ({"cluster": CLUSTER, "teams": {"a": {"windows": [{"days": ["monday"], "max_gpus": 1}]}}},
     "teams.a.windows[0].days[0]", "'mon'"),
    ({"cluster": CLUSTER, "teams": {"a": {"windows": [{"from": "20:00"}]}}}, "teams.a.windows[0]",
     "at least one of max_gpus"),
    ({"cluster": CLUSTER, "clock": {"timezone": "Mars/Olympus"}}, "clock.timezone", "IANA time zone"),
    ({"cluster": CLUSTER, "clock": {"start": "yesterday"}}, "clock.start", "ISO 8601"),
    ({"cluster": CLUSTER, "classes": {"batch": {"on_window_close": "kill"}}}, "classes.batch.on_window_close", "'kill'"),
])
def test_malformed_windows(raw, path, fragment):
    text = _error(raw)
    assert f": {path}: " in text and fragment in text


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


def test_exponent_floats_are_numbers_as_in_yaml_1_2():
    """PyYAML's YAML 1.1 reads 6e5 as a string; a policy means a number."""
    from gpushepherd.yamlio import load_yaml

    assert load_yaml("a: 6e5\nb: 1e-3\nc: -2E3\nd: e5\ne: 6e5x") == {"a": 600000.0, "b": 0.001, "c": -2000.0,
                                                                     "d": "e5", "e": "6e5x"}
    raw = load_yaml("cluster: {nodes: [{name: n1, gpus: 1}]}\npriority: {max_time_limit_s: 6e5}")
    assert policy_from_dict(raw).rules.priority.max_time_limit_s == 600000.0

"""`shepherd policy export --kueue` (design note 016, "Kueue"): the objects Kueue can
take, and the list of what it cannot express. Applied to a real API server with Kueue's
CRDs in `tests/test_kubernetes.py`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from gpushepherd.policy.kueue import export_kueue
from gpushepherd.policy.load import load_policy, parse_policy

COHORTS = """\
name: cohort-test
cluster:
  pools: [{name: train}, {name: serve}]
  nodes:
    - {name: a, count: 2, gpus: 8, gpu_type: H100-80GB, pool: train, taints: ["dedicated=train"]}
    - name: m
      gpus: 8
      gpu_type: A100-80GB
      pool: serve
      mig: {0: {layout: [3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb]}}
classes:
  production-inference: {priority: 400, preemptible: false, avoid_nodes_with: [sandbox]}
  training: {windows: [{name: night, from: "20:00", to: "08:00", max_gpus: 12}], max_gpus: 8}
teams:
  ml: {nominal_gpus: 8, max_gpus: 12, shares: 2}
  research: {nominal_gpus: 6, lending_limit: 2, max_gpus_per_user: 4}
  platform: {max_gpus: 4}
cohorts:
  shared: {members: [ml, research], reclaim: lower_priority}
preemption: {enabled: true}
"""


def by_kind(objects, kind):
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def test_teams_become_cluster_queues_with_their_quota_cohort_and_local_queue():
    objects, _ = export_kueue(parse_policy(COHORTS))
    cqs = by_kind(objects, "ClusterQueue")
    assert sorted(cqs) == ["ml", "platform", "research"]
    ml = cqs["ml"]["spec"]
    assert ml["cohortName"] == "shared" and ml["fairSharing"] == {"weight": "2"}
    assert ml["preemption"] == {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "LowerPriority"}
    group = ml["resourceGroups"][0]
    assert group["coveredResources"] == ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb",
                                         "nvidia.com/mig-3g.40gb"]
    rows = {f["name"]: {r["name"]: r for r in f["resources"]} for f in group["flavors"]}
    # nominal 8 in the cohort, may borrow up to max_gpus 12: 4 more
    assert rows["h100-80gb-train"]["nvidia.com/gpu"] == {"name": "nvidia.com/gpu", "nominalQuota": "8",
                                                         "borrowingLimit": "4"}
    assert rows["a100-80gb-serve"]["nvidia.com/mig-1g.10gb"]["nominalQuota"] == "2"  # the node's MIG instances
    assert rows["a100-80gb-serve"]["nvidia.com/gpu"]["nominalQuota"] == "7"  # one GPU of 8 is in MIG mode
    research = {f["name"]: f["resources"][0] for f in cqs["research"]["spec"]["resourceGroups"][0]["flavors"]}
    assert research["h100-80gb-train"]["lendingLimit"] == "2"
    platform = cqs["platform"]["spec"]
    assert "cohortName" not in platform and platform["preemption"]["reclaimWithinCohort"] == "Never"
    assert platform["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] == "4"  # max_gpus alone
    lqs = by_kind(objects, "LocalQueue")
    assert lqs["ml"]["metadata"]["namespace"] == "ml" and lqs["ml"]["spec"] == {"clusterQueue": "ml"}
    assert sorted(by_kind(objects, "Cohort")) == ["shared"]


def test_flavors_carry_the_gpu_type_pool_and_taints_and_classes_become_priority_classes():
    objects, _ = export_kueue(parse_policy(COHORTS))
    flavors = by_kind(objects, "ResourceFlavor")
    assert flavors["h100-80gb-train"]["spec"] == {
        "nodeLabels": {"nvidia.com/gpu.product": "H100-80GB", "gpushepherd.io/pool": "train"},
        "nodeTaints": [{"key": "dedicated", "value": "train", "effect": "NoSchedule"}]}
    prios = by_kind(objects, "WorkloadPriorityClass")
    assert prios["production-inference"]["value"] == 400 and prios["training"]["value"] == 300
    assert set(prios) >= {"batch", "sandbox", "research-training"}  # the standard classes too


def test_what_kueue_cannot_express_is_named_field_by_field():
    _, cannot = export_kueue(parse_policy(COHORTS))
    text = "\n".join(cannot)
    for field in ("classes.training.windows", "classes.training.max_gpus=8", "classes.sandbox.idle_stop",
                  "classes.production-inference.avoid_nodes_with=sandbox",
                  "classes.production-inference.preemptible=false", "teams.research.max_gpus_per_user=4",
                  "fair_share.half_life_s", "backfill reservations", "over 2 GPU flavors"):
        assert field in text, field
    assert len(cannot) == len(set(cannot))


def test_a_team_s_allowed_classes_are_named_as_what_kueue_cannot_express():
    raw = yaml.safe_load(COHORTS)
    team = next(iter(raw["teams"]))
    raw["teams"][team]["allowed_classes"] = ["batch", "training"]
    _, cannot = export_kueue(parse_policy(yaml.safe_dump(raw)))
    assert any(c.startswith(f"teams.{team}.allowed_classes=batch,training: ") for c in cannot), cannot


def test_the_cli_writes_multi_document_yaml_and_lists_the_rest_on_stderr(tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text(COHORTS)
    out = tmp_path / "kueue.yaml"
    p = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "policy", "export", str(policy), "--kueue",
                        "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    docs = [d for d in yaml.safe_load_all(out.read_text()) if d]
    assert {d["kind"] for d in docs} == {"ResourceFlavor", "Cohort", "ClusterQueue", "LocalQueue",
                                         "WorkloadPriorityClass"}
    assert all(d["apiVersion"] == "kueue.x-k8s.io/v1beta2" for d in docs)
    assert "# Not expressible in Kueue" in out.read_text() and "classes.training.windows" in p.stderr
    bad = subprocess.run([sys.executable, "-m", "gpushepherd.cli.main", "policy", "export", str(policy)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--kueue" in bad.stderr


def test_the_example_policies_export():
    for name in ("small-team", "philly"):
        objects, cannot = export_kueue(load_policy(Path(__file__).resolve().parent.parent / "examples" / "policies"
                                                   / f"{name}.yaml"))
        assert by_kind(objects, "ClusterQueue") and cannot

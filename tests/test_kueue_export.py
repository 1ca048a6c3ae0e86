"""`shepherd policy export --kueue` (design note 016, "Kueue"): the objects Kueue can
take, and the list of what it cannot express. Applied to a real API server with Kueue's
CRDs in `tests/test_kubernetes.py`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from builders import KUEUE_TRANSLATION

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
    # within_team unset (never): preemption.enabled is class preemption, not withinClusterQueue (a note says so)
    assert ml["preemption"] == {"withinClusterQueue": "Never", "reclaimWithinCohort": "LowerPriority"}
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


# -- a newcomer's policy: one cohort per pool, per-member quotas (issue 13 follow-up) ----------------
PER_POOL = KUEUE_TRANSLATION


def gpu_rows(objects, team: str) -> dict[str, dict]:
    """A ClusterQueue's nvidia.com/gpu row per flavor name, without the name."""
    cq = by_kind(objects, "ClusterQueue")[team]["spec"]
    return {f["name"]: {k: v for k, v in f["resources"][0].items() if k != "name"}
            for f in cq["resourceGroups"][0]["flavors"]}


def test_one_cohort_per_pool_exports_each_members_quota_on_its_pools_flavor():
    objects, cannot = export_kueue(parse_policy(PER_POOL))
    # hand-computed from the cohorts' members, flavor by flavor (Kueue: strings)
    assert gpu_rows(objects, "team-a") == {
        "h100-80gb-h100": {"nominalQuota": "4", "borrowingLimit": "4", "lendingLimit": "2"},
        "a100-80gb-a100": {"nominalQuota": "8", "borrowingLimit": "0"}}
    assert gpu_rows(objects, "team-b") == {
        "h100-80gb-h100": {"nominalQuota": "4"},  # no borrowingLimit: unlimited
        "a100-80gb-a100": {"nominalQuota": "8", "borrowingLimit": "8"}}
    # a ClusterQueue has one cohort: the two pools' cohorts, sharing members, are one Kueue Cohort
    assert sorted(by_kind(objects, "Cohort")) == ["research-a100-research-h100"]
    cqs = by_kind(objects, "ClusterQueue")
    assert {cqs[t]["spec"]["cohortName"] for t in cqs} == {"research-a100-research-h100"}
    assert any("cohorts research-a100, research-h100" in line and "per flavor" in line for line in cannot)
    # the team-level nominal 12 is used on no flavor: no warning about it
    assert not any(line.startswith("teams.team-a.nominal_gpus") for line in cannot)


def test_queueing_and_within_team_preemption_come_from_the_policy():
    objects, cannot = export_kueue(parse_policy(PER_POOL))
    cqs = by_kind(objects, "ClusterQueue")
    a, b = cqs["team-a"]["spec"], cqs["team-b"]["spec"]
    assert a["queueingStrategy"] == "StrictFIFO"  # every class team-a uses is strict_fifo for it
    assert b["queueingStrategy"] == "BestEffortFIFO"
    assert a["preemption"] == {"withinClusterQueue": "LowerPriority", "reclaimWithinCohort": "Any"}
    assert b["preemption"] == {"withinClusterQueue": "Never", "reclaimWithinCohort": "Any"}  # within_team: never
    text = "\n".join(cannot)
    assert "teams.team-a: strict_fifo" in text and "whole ClusterQueue" in text
    assert "preemption.enabled (class preemption)" in text and "withinClusterQueue" in text
    # one strict class of two: Kueue's strategy is per ClusterQueue, so BestEffortFIFO and a note
    mixed = PER_POOL.replace("      low-a100: {queueing: strict_fifo}\n", "")
    objects, cannot = export_kueue(parse_policy(mixed))
    assert by_kind(objects, "ClusterQueue")["team-a"]["spec"]["queueingStrategy"] == "BestEffortFIFO"
    assert any(line.startswith("teams.team-a: strict_fifo for classes high-a100, high-h100, low-h100 only")
               for line in cannot)


def test_quotas_per_gpu_type_become_per_flavor_quotas():
    """Note 038: `{GPU type: N}` quotas, one flavor per type, exported exactly; a number
    over several flavors is named as the approximation it is."""
    policy = """\
name: per-type
cluster:
  nodes:
  - {name: h, gpus: 8, gpu_type: H100-80GB}
  - {name: a, gpus: 8, gpu_type: A100-80GB}
teams:
  ml: {nominal_gpus: {H100-80GB: 2, A100-80GB: 6}, max_gpus: {H100-80GB: 4}, lending_limit: {A100-80GB: 1}}
  cv: {nominal_gpus: {H100-80GB: 6}, borrowing_limit: {A100-80GB: 3}}
  solo: {max_gpus: {A100-80GB: 5}}
  flat: {max_gpus: 3}
cohorts:
  shared: {members: [ml, cv]}
"""
    objects, cannot = export_kueue(parse_policy(policy))
    assert sorted(by_kind(objects, "ResourceFlavor")) == ["a100-80gb", "h100-80gb"]
    assert gpu_rows(objects, "ml") == {
        "a100-80gb": {"nominalQuota": "6", "lendingLimit": "1"},          # no cap on A100: borrowing unlimited
        "h100-80gb": {"nominalQuota": "2", "borrowingLimit": "2"}}        # max 4 - nominal 2
    assert gpu_rows(objects, "cv") == {
        "a100-80gb": {"nominalQuota": "0", "borrowingLimit": "3"},        # a type not named: none guaranteed
        "h100-80gb": {"nominalQuota": "6"}}
    assert gpu_rows(objects, "solo") == {"a100-80gb": {"nominalQuota": "5"}, "h100-80gb": {"nominalQuota": "8"}}
    assert gpu_rows(objects, "flat") == {"a100-80gb": {"nominalQuota": "3"}, "h100-80gb": {"nominalQuota": "3"}}
    text = "\n".join(cannot)
    assert "teams.flat.max_gpus=3 over 2 GPU flavors (a100-80gb, h100-80gb)" in text
    assert "teams.ml." not in text and "teams.cv." not in text and "teams.solo." not in text


def test_a_flavor_of_a_pool_the_team_has_no_cohort_for_is_its_own_alone():
    """team-c is in the h100 cohort only: on the a100 flavor it lends and borrows
    nothing, with its max_gpus (else the flavor's GPUs) as nominal quota."""
    policy = PER_POOL.replace("  team-b:\n    nominal_gpus: 12\n",
                              "  team-b:\n    nominal_gpus: 12\n  team-c: {max_gpus: 5}\n").replace(
        "    - {team: team-b, nominal_gpus: 4}\n",
        "    - {team: team-b, nominal_gpus: 4}\n    - {team: team-c, nominal_gpus: 0, borrowing_limit: 2}\n")
    objects, _ = export_kueue(parse_policy(policy))
    assert gpu_rows(objects, "team-c") == {
        "h100-80gb-h100": {"nominalQuota": "0", "borrowingLimit": "2"},
        "a100-80gb-a100": {"nominalQuota": "5", "borrowingLimit": "0", "lendingLimit": "0"}}
    assert by_kind(objects, "ClusterQueue")["team-c"]["spec"]["cohortName"] == "research-a100-research-h100"

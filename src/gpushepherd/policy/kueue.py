"""``shepherd policy export --kueue`` (design note 016, "Kueue"): the part of a policy
that Kueue (``kueue.x-k8s.io/v1beta2``, v0.17) can express, and the list of what it
cannot.

* a ``ResourceFlavor`` per GPU type and node pool (node labels
  ``nvidia.com/gpu.product`` and ``gpushepherd.io/pool``; the nodes' common taints);
* a ``ClusterQueue`` per team covering ``nvidia.com/gpu`` (and the MIG resources the
  nodes offer): ``nominalQuota`` from ``nominal_gpus`` (in a cohort) or ``max_gpus``
  (outside one), ``borrowingLimit`` / ``lendingLimit``, preemption within the queue by
  priority and within the cohort by the cohort's ``reclaim``, ``fairSharing.weight``
  from ``shares``; namespaces named after the team;
* a ``Cohort`` per cohort (and per parent team: Kueue's hierarchical cohorts);
* a ``LocalQueue`` per team in the namespace of the team's name;
* a ``WorkloadPriorityClass`` per workload class (``value``: the class priority).
"""

from __future__ import annotations

import re

from gpushepherd.policy.load import Policy

API = "kueue.x-k8s.io/v1beta2"
GPU = "nvidia.com/gpu"
POOL_LABEL = "gpushepherd.io/pool"
RECLAIM = {"any": "Any", "lower_priority": "LowerPriority", "never": "Never"}


def _dns(text: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", text.lower()).strip("-")[:63] or "x"


def _meta(name: str, **extra) -> dict:
    return {"name": _dns(name), **extra}


def export_kueue(policy: Policy) -> tuple[list[dict], list[str]]:
    """``(objects, cannot)``: the Kueue objects for ``policy`` (sorted: flavors,
    cohorts, cluster queues, local queues, priority classes) and one line per policy
    field Kueue cannot express, naming the field and what was done instead."""
    spec, rules = policy.spec, policy.rules
    cannot: list[str] = []
    # ---------------------------------------------------------------- flavors
    flavors: dict[tuple[str, str], dict] = {}
    capacity: dict[tuple[str, str], int] = {}
    mig_capacity: dict[tuple[str, str], dict[str, int]] = {}
    taints: dict[tuple[str, str], set[str] | None] = {}
    multi_pool = len({n.pool for n in rules.nodes}) > 1
    for n in rules.nodes:
        key = (n.gpu_type, n.pool)
        whole = n.gpus - len(n.mig)
        capacity[key] = capacity.get(key, 0) + whole
        for _g, layout in n.mig:
            for inst in layout:
                d = mig_capacity.setdefault(key, {})
                d[inst.profile] = d.get(inst.profile, 0) + 1
        ts = set(n.taints)
        taints[key] = ts if key not in taints else (taints[key] & ts)
    for key in sorted(capacity):
        gpu_type, pool = key
        labels = {"nvidia.com/gpu.product": gpu_type}
        if multi_pool or pool != "default":
            labels[POOL_LABEL] = pool
        body: dict = {"nodeLabels": labels}
        if taints[key]:
            body["nodeTaints"] = [{"key": t.split("=", 1)[0], **({"value": t.split("=", 1)[1]} if "=" in t else {}),
                                   "effect": "NoSchedule"} for t in sorted(taints[key])]
        name = f"{gpu_type}-{pool}" if (multi_pool or pool != "default") else gpu_type
        flavors[key] = {"apiVersion": API, "kind": "ResourceFlavor", "metadata": _meta(name), "spec": body}
    resources = [GPU] + sorted({f"nvidia.com/mig-{p}" for d in mig_capacity.values() for p in d})
    if len(flavors) > 1:
        cannot.append(f"teams.*.nominal_gpus / max_gpus over {len(flavors)} GPU flavors: Kueue's quotas are per "
                      "flavor; each flavor got the team's whole quota (capped at the flavor's GPUs), so a team "
                      "could hold more in total than its limit")
    # ---------------------------------------------------------------- cohorts
    cohort_of: dict[str, str] = {}
    member_quota: dict[str, tuple[int | None, int | None, int | None]] = {}
    reclaim_of: dict[str, str] = {}
    cohorts: list[dict] = []
    for cname, co in sorted(spec.cohorts.items()):
        if co.pool is not None:
            cannot.append(f"cohorts.{cname}.pool={co.pool}: a cohort for one pool; Kueue's cohorts pool every "
                          "flavor of their members")
        cohorts.append({"apiVersion": API, "kind": "Cohort", "metadata": _meta(cname), "spec": {}})
        for m in co.members:
            if m.team in cohort_of:
                cannot.append(f"cohorts.{cname}: team {m.team} is also in cohort {cohort_of[m.team]}: a Kueue "
                              "ClusterQueue has one cohort; exported in the first")
                continue
            cohort_of[m.team] = cname
            member_quota[m.team] = (m.nominal_gpus, m.borrowing_limit, m.lending_limit)
            reclaim_of[m.team] = RECLAIM[co.reclaim]
    parents = sorted({t.parent for t in spec.teams.values() if t.parent})
    for p in parents:
        cannot.append(f"teams.*.parent={p}: a parent's limits (max_gpus ...) cap its children together; exported "
                      f"as a Kueue Cohort {_dns(p)} whose members share quota, without that cap")
        if p not in spec.cohorts:
            cohorts.append({"apiVersion": API, "kind": "Cohort", "metadata": _meta(p), "spec": {}})
    # ---------------------------------------------------------------- queues
    queues, local = [], []
    within = "LowerPriority" if spec.preemption.enabled else "Never"
    for team in sorted(spec.teams):
        t = spec.teams[team]
        nominal, borrow, lend = member_quota.get(team, (None, None, None))
        nominal = t.nominal_gpus if nominal is None else nominal
        borrow = t.borrowing_limit if borrow is None else borrow
        lend = t.lending_limit if lend is None else lend
        cohort = cohort_of.get(team) or t.parent
        flavor_rows = []
        for key, fl in flavors.items():
            cap = capacity[key]
            # a quota per GPU type (note 038) is the flavor's own: a type not named has none
            f_nom = _of_type(nominal, key[0], 0)
            f_borrow, f_lend, f_max = (_of_type(v, key[0], None) for v in (borrow, lend, t.max_gpus))
            if cohort and f_max is not None and f_borrow is None:
                f_borrow = max(0, f_max - (f_nom or 0))
            if not cohort:
                f_nom = f_max if f_max is not None else f_nom
            rows = [{"name": GPU, "nominalQuota": str(cap if f_nom is None else min(f_nom, cap))}]
            if cohort and f_borrow is not None:
                rows[0]["borrowingLimit"] = str(f_borrow)
            if cohort and f_lend is not None:
                rows[0]["lendingLimit"] = str(f_lend)
            for res in resources[1:]:
                profile = res.removeprefix("nvidia.com/mig-")
                rows.append({"name": res, "nominalQuota": str(mig_capacity.get(key, {}).get(profile, 0))})
            flavor_rows.append({"name": fl["metadata"]["name"], "resources": rows})
        body = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": _dns(team)}},
                "queueingStrategy": "BestEffortFIFO",
                "resourceGroups": [{"coveredResources": resources, "flavors": flavor_rows}],
                "preemption": {"withinClusterQueue": within,
                               "reclaimWithinCohort": reclaim_of.get(team, "Any" if cohort else "Never")}}
        if cohort:
            body["cohortName"] = _dns(cohort)
        if t.shares is not None:
            body["fairSharing"] = {"weight": str(t.shares)}
        queues.append({"apiVersion": API, "kind": "ClusterQueue", "metadata": _meta(team), "spec": body})
        local.append({"apiVersion": API, "kind": "LocalQueue", "metadata": _meta(team, namespace=_dns(team)),
                      "spec": {"clusterQueue": _dns(team)}})
        for f in ("max_gpus_per_user", "max_running_jobs", "max_running_jobs_per_user"):
            if getattr(t, f) is not None:
                cannot.append(f"teams.{team}.{f}={getattr(t, f)}: Kueue has no per-user or running-job limits")
        if t.windows:
            cannot.append(f"teams.{team}.windows: limits by time of day and week (Kueue's quotas do not change "
                          "with time)")
        if t.allowed_classes is not None:
            cannot.append(f"teams.{team}.allowed_classes={','.join(t.allowed_classes) or '[]'}: which classes a team "
                          "may submit (every LocalQueue may use every WorkloadPriorityClass; an admission policy "
                          "on the kueue.x-k8s.io/priority-class label can refuse the others)")
        for cls, lim in sorted(t.classes.items()):
            cannot.append(f"teams.{team}.classes.{cls}: a team's per-class limits (Kueue's quota is per "
                          "ClusterQueue, not per priority class)")
    # ---------------------------------------------------------------- classes
    prios = []
    for name in sorted(rules.classes):
        c = rules.classes[name]
        prios.append({"apiVersion": API, "kind": "WorkloadPriorityClass", "metadata": _meta(name),
                      "value": int(c.priority), "description": f"gpushepherd workload class {name}"})
        cs = spec.classes.get(name)
        if not c.preemptible:
            cannot.append(f"classes.{name}.preemptible=false: Kueue preempts by priority alone; a class that is "
                          "never preempted is only as safe as its priority is high")
        if c.preempt_only_if_checkpointable or c.checkpointable:
            cannot.append(f"classes.{name}.checkpointable / preempt_only_if_checkpointable: Kueue does not know "
                          "which workloads checkpoint (exit code 85 is gpushepherd's contract)")
        if c.idle_stop is not None:
            cannot.append(f"classes.{name}.idle_stop: stopping idle GPU jobs (Kueue sees no GPU utilisation)")
        if cs is None:
            continue
        for f in ("max_gpus", "max_gpus_per_user", "max_running_jobs_per_user", "reserved_gpus"):
            if getattr(cs, f) is not None:
                cannot.append(f"classes.{name}.{f}={getattr(cs, f)}: Kueue has no class-wide caps or reservations")
        if cs.windows or cs.on_window_close:
            cannot.append(f"classes.{name}.windows / on_window_close: limits by time of day and week, and "
                          "checkpoint-and-stop when a window closes")
        if cs.memory_overrun:
            cannot.append(f"classes.{name}.memory_overrun: GPU memory over the declaration")
        if cs.grace_period_s is not None or cs.stop_signal:
            cannot.append(f"classes.{name}.grace_period_s / stop_signal: set terminationGracePeriodSeconds and "
                          "the container's STOPSIGNAL in the pod template; not a queue setting")
        if cs.max_runtime_s or cs.default_time_limit_s:
            cannot.append(f"classes.{name}.max_runtime_s / default_time_limit_s: a time limit per job "
                          "(activeDeadlineSeconds, or the label kueue.x-k8s.io/max-exec-time-seconds), not per "
                          "priority class")
        if cs.pools:
            cannot.append(f"classes.{name}.pools={','.join(cs.pools)}: flavors are per ClusterQueue, not per "
                          "priority class")
        if cs.avoid_nodes_with:
            cannot.append(f"classes.{name}.avoid_nodes_with={','.join(cs.avoid_nodes_with)}: anti-affinity "
                          "between classes (pod anti-affinity in the pod templates comes closest)")
        if cs.require_island:
            cannot.append(f"classes.{name}.require_island: one NVLink island per job (the kubelet's TopologyManager "
                          "policy single-numa-node is per node, not per priority class)")
        if cs.sharing and set(cs.sharing) - {"whole", "mig"}:
            cannot.append(f"classes.{name}.sharing={','.join(cs.sharing)}: fractions, time-slicing and MPS "
                          "shares are not Kueue resources (MIG instances are: nvidia.com/mig-*)")
    # ---------------------------------------------------------------- the rest
    if spec.preemption.min_runtime_s:
        cannot.append(f"preemption.min_runtime_s={spec.preemption.min_runtime_s:g}: Kueue preempts jobs of any age")
    if spec.preemption.enabled:
        cannot.append("preemption across teams outside a cohort: gpushepherd preempts any lower, preemptible "
                      "class; Kueue preempts within a ClusterQueue, and in a cohort to reclaim quota")
    w = spec.priority.weights
    if w.fair_share or w.age or w.size or w.time_limit:
        cannot.append("priority.weights (fair_share, age, size, time_limit): multifactor priority; Kueue orders "
                      "by priority class, then creation time")
    cannot.append(f"fair_share.half_life_s={spec.fair_share.half_life_s:g}: Kueue's admission fair sharing "
                  "(usageHalfLifeTime) is set in the controller's Configuration, not in an API object")
    if spec.backfill.enabled:
        cannot.append("backfill reservations: Kueue's BestEffortFIFO admits later workloads that fit, without "
                      "reserving GPUs for the blocked one")
    if spec.mig.reconfigure:
        cannot.append("mig.reconfigure: re-partitioning MIG GPUs for the pending mix")
    if spec.prediction.enabled:
        cannot.append("prediction: runtime predictions for reservations")
    for n in rules.nodes:
        if n.nvlink_islands:
            cannot.append("cluster.nodes[].nvlink_islands: NVLink-aware placement (Kueue's topology-aware "
                          "scheduling works on node labels, not GPU islands)")
            break
    cannot.append("deadlines, estimates and pending reasons per job: gpushepherd's API (`shepherd why`); Kueue "
                  "shows a Workload's conditions")
    objects = list(flavors.values()) + cohorts + queues + local + prios
    return objects, list(dict.fromkeys(cannot))


def to_yaml(objects: list[dict], cannot: list[str], source: str) -> str:
    """The objects as one multi-document YAML, headed by comments naming ``source`` and
    each thing Kueue cannot express."""
    import yaml

    head = [f"# Kueue objects exported by `shepherd policy export --kueue` from {source}",
            "# (kueue.x-k8s.io/v1beta2; apply the namespaces of the LocalQueues first).",
            "# Not expressible in Kueue, and left to gpushepherd:"]
    head += [f"#   - {line}" for line in cannot]
    docs = [yaml.safe_dump(o, sort_keys=False, default_flow_style=False) for o in objects]
    return "\n".join(head) + "\n---\n" + "---\n".join(docs)


def _of_type(value, gpu_type: str, unnamed):
    """A GPU quota field's value for one flavor's GPU type: the number, or the type's
    entry of a per-type mapping (``unnamed`` when the mapping does not name it)."""
    if isinstance(value, dict):
        return value.get(gpu_type, unnamed)
    return value

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
#: ``teams.X.preemption.within_team`` -> ``withinClusterQueue`` (note 035)
WITHIN = {"lower_priority": "LowerPriority", "never": "Never"}


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
    # ---------------------------------------------------------------- cohorts
    # A ClusterQueue has one cohort. Cohorts for different pools that share a member become
    # one Kueue Cohort: Kueue's quotas and borrowing are per flavor, so each pool's quota is
    # still lent and borrowed on its own flavors only (a member's values for its pool's flavors;
    # 0 to lend and borrow on the flavors of a pool it is in no cohort of).
    membership: dict[str, dict[str | None, tuple[str, object]]] = {}  # team -> pool -> (cohort, member)
    group = {c: c for c in spec.cohorts}

    def root(c: str) -> str:
        while group[c] != c:
            c = group[c]
        return c
    for cname, co in sorted(spec.cohorts.items()):
        for m in co.members:
            mine = membership.setdefault(m.team, {})
            if co.pool in mine:  # pragma: no cover - the schema allows one cohort per pool per team
                cannot.append(f"cohorts.{cname}: team {m.team} is also in cohort {mine[co.pool][0]} for the same "
                              "pool: exported in the first")
                continue
            for other, _m in mine.values():
                group[root(cname)] = root(other)
            mine[co.pool] = (cname, m)
    merged: dict[str, list[str]] = {}
    for cname in sorted(spec.cohorts):
        merged.setdefault(root(cname), []).append(cname)
    kueue_cohort = {c: "-".join(names) for names in merged.values() for c in names}
    cohorts: list[dict] = []
    for names in merged.values():
        cohorts.append({"apiVersion": API, "kind": "Cohort", "metadata": _meta("-".join(names)), "spec": {}})
        if len(names) > 1:
            cannot.append(f"cohorts {', '.join(names)} (pools {', '.join(str(spec.cohorts[c].pool) for c in names)}) "
                          f"share members: one Kueue Cohort {_dns('-'.join(names))} (a ClusterQueue has one "
                          "cohort); quotas, borrowing and lending stay per flavor, so per pool")
            reclaims = {spec.cohorts[c].reclaim for c in names}
            if len(reclaims) > 1:
                cannot.append(f"cohorts {', '.join(names)}: reclaim {', '.join(sorted(reclaims))} differ; Kueue's "
                              "reclaimWithinCohort is one per ClusterQueue: each member got its first cohort's")
    for cname, co in sorted(spec.cohorts.items()):
        if co.pool is not None and not any(co.pool == n.pool for n in rules.nodes):  # pragma: no cover
            cannot.append(f"cohorts.{cname}.pool={co.pool}: no node in the pool")
    parents = sorted({t.parent for t in spec.teams.values() if t.parent})
    for p in parents:
        cannot.append(f"teams.*.parent={p}: a parent's limits (max_gpus ...) cap its children together; exported "
                      f"as a Kueue Cohort {_dns(p)} whose members share quota, without that cap")
        if p not in spec.cohorts:
            cohorts.append({"apiVersion": API, "kind": "Cohort", "metadata": _meta(p), "spec": {}})
    # ---------------------------------------------------------------- queues
    queues, local = [], []
    spread: dict[tuple[str, int], set[str]] = {}  # a quota value -> the flavors that got it whole
    for team in sorted(spec.teams):
        t = spec.teams[team]
        mine = membership.get(team, {})
        first = mine[min(mine, key=lambda pool: mine[pool][0])][0] if mine else None
        cohort = kueue_cohort[first] if first else t.parent
        flavor_rows = []
        for key, fl in flavors.items():
            gpu_type, pool = key
            cap = capacity[key]
            entry = mine.get(pool) or mine.get(None)
            fields = ("nominal_gpus", "borrowing_limit", "lending_limit")
            if entry is not None:  # the team's quota in the cohort of this flavor's pool (or of every pool)
                cname, m = entry
                src = [(f"cohorts.{cname}.members.{team}.{f}", getattr(m, f)) if getattr(m, f) is not None
                       else (f"teams.{team}.{f}", getattr(t, f)) for f in fields]
            elif mine:  # in a cohort, but of other pools: this flavor is the team's alone
                src = [(f"teams.{team}.max_gpus", t.max_gpus), ("", 0), ("", 0)]
            else:
                src = [(f"teams.{team}.{f}", getattr(t, f)) for f in fields]
            (nominal, borrow, lend) = (v for _f, v in src)
            for field, v in src + [(f"teams.{team}.max_gpus", t.max_gpus)]:
                if field and v is not None and (not isinstance(v, dict) or gpu_type in v):
                    label = field if not isinstance(v, dict) else f"{field}[{gpu_type}]"
                    spread.setdefault((label, _of_type(v, gpu_type, None)), set()).add(fl["metadata"]["name"])
            # a quota per GPU type (note 038) is the flavor's own: a type not named has none
            f_nom = _of_type(nominal, gpu_type, 0)
            f_borrow, f_lend, f_max = (_of_type(v, gpu_type, None) for v in (borrow, lend, t.max_gpus))
            if entry is None and mine:
                f_nom = f_max
            if cohort and f_max is not None and f_borrow is None:
                f_borrow = max(0, f_max - (f_nom or 0))
            if not cohort:
                f_nom = f_max if f_max is not None else f_nom
            rows = [{"name": GPU, "nominalQuota": str(cap if f_nom is None else min(f_nom, cap))}]
            if cohort and f_borrow is not None:
                rows[0]["borrowingLimit"] = str(f_borrow)
            if cohort and f_lend is not None:
                rows[0]["lendingLimit"] = str(min(f_lend, cap if f_nom is None else min(f_nom, cap)))
            for res in resources[1:]:
                profile = res.removeprefix("nvidia.com/mig-")
                rows.append({"name": res, "nominalQuota": str(mig_capacity.get(key, {}).get(profile, 0))})
            flavor_rows.append({"name": fl["metadata"]["name"], "resources": rows})
        strategy = _queueing(spec, rules, team, cannot)
        body = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": _dns(team)}},
                "queueingStrategy": strategy,
                "resourceGroups": [{"coveredResources": resources, "flavors": flavor_rows}],
                "preemption": {"withinClusterQueue": WITHIN[t.preemption.within_team],
                               "reclaimWithinCohort": (RECLAIM[spec.cohorts[first].reclaim] if first
                                                       else "Any" if cohort else "Never")}}
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
            if lim.max_gpus is not None or lim.max_running_jobs is not None:
                cannot.append(f"teams.{team}.classes.{cls}: a team's per-class limits (Kueue's quota is per "
                              "ClusterQueue, not per priority class)")
    for (label, v), names in sorted(spread.items()):
        if len(names) > 1:
            cannot.append(f"{label}={v} over {len(names)} GPU flavors ({', '.join(sorted(names))}): Kueue's quotas "
                          "are per flavor; each flavor got the whole value (capped at its GPUs), so a team could "
                          "hold, borrow or lend more in total than the policy allows (a quota per GPU type, one "
                          "type per pool, is exact)")
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
        cannot.append("preemption.enabled (class preemption): gpushepherd lets a higher class preempt lower, "
                      "preemptible classes of any team when GPUs are short; Kueue preempts only to admit within "
                      "quota: withinClusterQueue (from teams.*.preemption.within_team: a team's own jobs when its "
                      "quota binds) and reclaimWithinCohort (from cohorts.*.reclaim: lent quota taken back)")
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


def _queueing(spec, rules, team: str, cannot: list[str]) -> str:
    """A team's ClusterQueue ``queueingStrategy``: ``StrictFIFO`` when every class the
    policy names (else every class) is ``strict_fifo`` for the team (``teams.X.classes.C.
    queueing``, else ``classes.C.queueing``), else ``BestEffortFIFO``; a mix, and the
    scope of strict order, are added to ``cannot``."""
    t = spec.teams[team]
    named = sorted(set(spec.classes) | set(t.classes)) or sorted(rules.classes)
    strict = []
    for c in named:
        own = t.classes[c].queueing if c in t.classes else None
        cls = spec.classes[c].queueing if c in spec.classes else None
        if (own or cls or "best_effort_fifo") == "strict_fifo":
            strict.append(c)
    if not strict:
        return "BestEffortFIFO"
    if len(strict) < len(named):
        cannot.append(f"teams.{team}: strict_fifo for classes {', '.join(strict)} only; Kueue's queueingStrategy "
                      "is one per ClusterQueue: exported BestEffortFIFO")
        return "BestEffortFIFO"
    cannot.append(f"teams.{team}: strict_fifo holds a job back only behind an earlier one for the same GPU type or "
                  "pool; Kueue's StrictFIFO holds the whole ClusterQueue behind its head")
    return "StrictFIFO"


def _of_type(value, gpu_type: str, unnamed):
    """A GPU quota field's value for one flavor's GPU type: the number, or the type's
    entry of a per-type mapping (``unnamed`` when the mapping does not name it)."""
    if isinstance(value, dict):
        return value.get(gpu_type, unnamed)
    return value

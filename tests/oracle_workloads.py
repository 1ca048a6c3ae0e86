"""Random small workloads that mix every rule of the policy at once (issue 20, item 4;
design note 015, section 8), for the oracle tests (``tests/test_oracle.py``) and the
seeded batch (``bench/oracle.py``).

One generator, two sources of choices:

* ``workloads()`` - a Hypothesis strategy (shrinks to a small failing example);
* ``workload_from_seed(seed)`` - the same generator driven by ``random.Random(seed)``
  (the bench names a failure by its seed).

Both call ``build(src)``, which asks ``src`` for every choice (``integer``, ``choice``,
``chance``), so the two draw from the same space with the same structure; a choice
that Hypothesis shrinks goes towards the first option / the low end / "no".

A workload is 1-4 nodes (mixed sizes and GPU types, NVLink islands, labels, taints, two
pools, time-slicing, MPS, MIG GPUs), teams with hard limits, per-user caps, job counts,
per-class limits and a parent, cohorts (nominal quota, borrowing and lending limits,
each reclaim mode, a cohort for one pool), quotas per GPU type (``max_gpus`` and a
cohort's nominal / borrowing / lending limits per type, note 038), classes with ``reserved_gpus``, grace
periods, max runtimes, anti-affinity, sharing kinds, NVLink islands required, time windows (Europe/Berlin or
America/New_York starting at local midnight of a DST change, ``drain`` or
``checkpoint-and-stop``), multifactor priority (fair-share, age, time limit) with a
recalculation period and the top class as a hard tier (note 045), preemption with a
minimum runtime, backfill depth 0-3, MIG
reconfiguration and runtime prediction; jobs of every class - gangs, ``same_node``,
``require_island`` (over its class's), time limits, estimates exact / over / under the
true duration or none, shares (fraction, memory only, time-slicing, MPS, MIG), node
selectors, tolerations, GPU
types and memory, cache keys, deadlines; and events - cancels, operator requeues, node
loss and return, a new node, GPUs going bad and back, and restarts of the core
(``Restart``).

Every policy is valid by construction (``policy_from_dict`` accepts it; the test
``test_every_generated_policy_is_valid`` checks thousands).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from gpushepherd.model.cluster import Node
from gpushepherd.model.events import (
    GpuHealthChanged,
    JobCancelled,
    JobRequeueRequested,
    JobUpdated,
    NodeAdded,
    NodeLost,
)
from gpushepherd.model.job import GpuShare, JobSpec
from gpushepherd.policy import policy_from_dict
from gpushepherd.sim.engine import Restart

CLASSES = ("production-inference", "training", "research-training", "batch", "sandbox")
#: (GPU type, memory MiB, MIG-capable)
GPU_TYPES = (("A100-80GB", 81920, True), ("A100-80GB", 81920, True), ("A100-40GB", 40960, False),
             ("H100-80GB", 81920, True), ("L40S", 46068, False))
#: valid MIG layouts of an 80 GB A100 / H100 (profile names as NVIDIA writes them)
MIG_LAYOUTS = (("3g.40gb", "3g.40gb"), ("4g.40gb", "2g.20gb", "1g.10gb"), ("1g.10gb",) * 7,
               ("2g.20gb",) * 3, ("7g.80gb",), ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"))
MIG_PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
#: (time zone, local midnight before a DST change); every change is at t = 7200 (spring:
#: the hour 02:00-03:00 is skipped) or repeats an hour from t = 7200 (New York) or
#: 10800 (Berlin) on
CLOCKS = (("Europe/Berlin", "2026-03-29T00:00:00"), ("Europe/Berlin", "2026-10-25T00:00:00"),
          ("America/New_York", "2026-03-08T00:00:00"), ("America/New_York", "2026-11-01T00:00:00"))
#: window edges around the changed hour
EDGES_FROM = ("00:00", "01:00", "01:30", "02:00", "02:30", "03:00", "03:30", "22:00")
EDGES_TO = ("01:00", "02:30", "03:00", "03:30", "04:00", "24:00")
SHARE_KINDS = ("fraction", "time_slice", "mps", "mig")


# ------------------------------------------------------------- sources of choices
class RandomSource:
    """Choices from a seeded ``random.Random``."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, options):
        options = list(options)
        return options[self.rng.randrange(len(options))]

    def chance(self, p: float) -> bool:
        return self.rng.randrange(100) < round(p * 100)


class HypothesisSource:
    """Choices from Hypothesis's ``draw`` (shrinking goes to the low end, the first
    option, and "no")."""

    def __init__(self, draw):
        from hypothesis import strategies as st

        self.draw = draw
        self.st = st

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(self.st.integers(lo, hi))

    def choice(self, options):
        return self.draw(self.st.sampled_from(list(options)))

    def chance(self, p: float) -> bool:
        return self.draw(self.st.integers(0, 99)) >= 100 - round(p * 100)


# ------------------------------------------------------------------ the workload
@dataclass
class Workload:
    """A policy mapping, jobs with true durations, and events (``Restart`` included)."""

    raw: dict
    jobs: list[tuple[JobSpec, float]]
    events: list
    seed: int | None = None
    rules: object = field(default=None, repr=False)

    def __post_init__(self):
        if self.rules is None:
            self.rules = policy_from_dict(self.raw).rules

    def without_restarts(self) -> Workload:
        return Workload(self.raw, self.jobs, [e for e in self.events if not isinstance(e, Restart)], self.seed,
                        self.rules)

    @property
    def restarts(self) -> list[float]:
        return sorted(e.t for e in self.events if isinstance(e, Restart))

    def __repr__(self) -> str:  # what Hypothesis prints for a failing example
        lines = [f"seed={self.seed!r}", f"policy={self.raw!r}"]
        lines += [f"  {s!r}  duration={d!r}" for s, d in self.jobs]
        lines += [f"  event {e!r}" for e in self.events]
        return "Workload(\n" + "\n".join(lines) + "\n)"

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(repr(self))


def workload_from_seed(seed: int, share_preemption: bool = True) -> Workload:
    """The workload of ``seed`` (the bench's and the suite's seeded batch);
    ``share_preemption`` False: without the jobs ``_share_preemption`` adds (a seed's
    workload before those draws, or before they took classes' ``reserved_gpus``)."""
    wl = build(RandomSource(seed), share_preemption)
    wl.seed = seed
    return wl


def workloads():
    """A Hypothesis strategy of workloads (``build`` on Hypothesis's choices)."""
    from hypothesis import strategies as st

    @st.composite
    def _w(draw):
        return build(HypothesisSource(draw))

    return _w()


# ------------------------------------------------------------------- generator
def build(src, share_preemption: bool = True) -> Workload:
    """One workload from the choices of ``src`` (``RandomSource`` or ``HypothesisSource``)."""
    windows_on = src.chance(0.35)
    # time scale: workloads with windows span hours (the DST change at t = 7200)
    scale = 300.0 if windows_on else 1.0
    nodes = _nodes(src)
    total = sum(n["gpus"] for n in nodes)
    pools = sorted({n.get("pool", "default") for n in nodes})
    raw: dict = {"cluster": {"nodes": nodes}}
    if "inf" in pools:
        raw["cluster"]["pools"] = [{"name": p} for p in pools]
    classes = _classes(src, scale, total, pools, windows_on)
    reserved = sum(c.get("reserved_gpus", 0) for c in classes.values())
    teams, cohorts = _teams(src, scale, total, reserved, windows_on, nodes, classes)
    if classes:
        raw["classes"] = classes
    raw["teams"] = teams
    if cohorts:
        raw["cohorts"] = cohorts
    raw["preemption"] = {"enabled": src.chance(0.8), "min_runtime_s": src.choice([0.0, 0.0, 5.0 * scale])}
    depth = src.integer(0, 3)
    raw["backfill"] = {"enabled": depth > 0, "reservations": max(1, depth)}
    if src.chance(0.5):
        weights: dict = {}
        if src.chance(0.7):
            weights["fair_share"] = src.choice([1000.0, 100000.0])
        if src.chance(0.4):
            weights["age"] = 1000.0
        if src.chance(0.4):
            weights["time_limit"] = 1000.0
        if src.chance(0.2):
            weights["size"] = 1000.0
        raw["priority"] = {"weights": weights, "recalc_s": float(src.integer(1, 20)) * scale,
                           "max_age_s": 100.0 * scale, "max_time_limit_s": 100.0 * scale}
        raw["fair_share"] = {"half_life_s": src.choice([100.0 * scale, 7 * 86400.0]),
                             "level": src.choice(["team", "user"])}
    if any(n.get("mig") for n in nodes) and src.chance(0.4):
        raw["mig"] = {"reconfigure": True, "delay_s": float(src.integer(0, 10)) * scale}
    if src.chance(0.1):
        raw["prediction"] = {"enabled": True, "history": 5, "min_jobs": 1, "quantile": 0.9}
    if windows_on or src.chance(0.1):
        zone, start = src.choice(CLOCKS)
        raw["clock"] = {"timezone": zone, "start": start}
    rules = policy_from_dict(raw).rules
    jobs = _jobs(src, scale, raw, rules)
    events = _events(src, scale, raw, rules, len(jobs))
    # drawn last, so that the seeds found before these rules keep their workloads
    if _later_rules(src, raw, scale):
        rules = policy_from_dict(raw).rules
    events += _updates(src, scale, rules, jobs)
    jobs = _later_jobs(src, jobs)
    if share_preemption:
        jobs = _share_preemption(src, scale, raw, rules, jobs)
    # drawn last (note 045): the top class as a hard tier of the order, at times with the
    # class weight 0 (the bundled default order), so that weights and nice may pass classes
    if src.chance(0.25):
        prio = raw.setdefault("priority", {})
        prio["top_class_tier"] = True
        if src.chance(0.5):
            prio.setdefault("weights", {})["class"] = 0.0
        rules = policy_from_dict(raw).rules
    # drawn after that (note 053): the aged tier - a job that has waited age_tier_s at a
    # recalculation goes before all but the top class, the oldest first (at times only the
    # oldest one or two of them)
    if src.chance(0.25):
        prio = raw.setdefault("priority", {})
        prio["age_tier_s"] = float(src.integer(1, 40)) * scale
        prio.setdefault("recalc_s", float(src.integer(1, 10)) * scale)
        if src.chance(0.5):  # only the oldest few aged jobs lifted
            prio["age_tier_jobs"] = src.integer(1, 2)
        rules = policy_from_dict(raw).rules
    return Workload(raw, jobs, events, rules=rules)


def _updates(src, scale: float, rules, jobs: list[tuple[JobSpec, float]]) -> list:
    """``scontrol update`` of pending and running jobs (note 039), drawn after every other
    choice: an admin's new time limit (up to the class's max runtime; below what a
    running job has run, it stops it at once) or nice (a nudge either way, from one that
    reorders jobs of a class to one that passes classes)."""
    out: list = []
    for _ in range(src.integer(0, 3) if src.chance(0.4) else 0):
        spec, _d = src.choice(jobs)
        t = float(src.integer(0, 60)) * scale
        if src.chance(0.5):
            limit = float(src.integer(1, 80)) * scale
            cls = rules.classes[spec.workload_class]
            if cls.max_runtime_s is not None:
                limit = min(limit, cls.max_runtime_s)
            out.append(JobUpdated(t, spec.id, time_limit_s=limit))
        else:
            out.append(JobUpdated(t, spec.id, nice=src.choice([-1_000_000, -1000, -1, 1, 1000, 2_000_000])))
    return out


def _later_jobs(src, jobs: list) -> list:
    """Job fields added after most FOUND seeds (drawn last, as ``_later_rules``): a job's
    own ``require_island`` over its class's; an MPS share without an SM percentage (1 /
    ``max_clients`` where it lands), with several client processes or another memory
    declaration (note 037)."""
    out = []
    for spec, duration in jobs:
        if spec.share is None and spec.gpus > 1 and not spec.gpus_per_pod and src.chance(0.15):
            spec = replace(spec, require_island=src.choice([True, True, False]))
        elif spec.share is not None and spec.share.kind == "mps" and src.chance(0.5):
            spec = replace(spec, share=replace(spec.share, milli=src.choice([0, 0, spec.share.milli]),
                                               mem_mib=src.choice([0, 6144, spec.share.mem_mib]),
                                               procs=src.integer(1, 3)))
        out.append((spec, duration))
    return out


def _share_preemption(src, scale: float, raw: dict, rules, jobs: list) -> list:
    """Shares as victims and as preemptors (note 042; drawn last, as ``_later_jobs``):
    sometimes a few more jobs of one share kind the nodes offer - lower classes early,
    mostly shares with long or no runs, higher classes later, shares where their class
    may share, else whole GPUs (production inference always); with classes'
    ``reserved_gpus`` too (a share joining a card only a short reserved class holds,
    note 042 "Class reservations")."""
    kinds = [k for k in ("fraction", "time_slice", "mps") if any(n.supports(k) for n in rules.nodes)]
    if not kinds or not src.chance(0.35):
        return jobs
    kind = src.choice(kinds)
    teams = list(raw["teams"])
    out = list(jobs)
    for i in range(src.integer(3, 8)):
        low = src.chance(0.6)
        name = src.choice(["sandbox", "research-training", "batch"] if low else ["batch", "training",
                                                                                   "production-inference"])
        cls = rules.classes[name]
        kw: dict = {}
        if (cls.sharing is None or kind in cls.sharing) and src.chance(0.8):
            if kind == "fraction":
                kw["share"] = GpuShare("fraction", milli=src.choice([250, 500, 750, 1000]))
            elif kind == "time_slice":
                kw["share"] = GpuShare("time_slice", mem_mib=8192, slots=src.integer(1, 2))
            else:
                kw["share"] = GpuShare("mps", milli=src.choice([250, 500]), slots=src.integer(1, 2))
            gpus = 1
        else:
            gpus = src.choice([1, 1, 2, 4])
        duration = float(src.integer(20, 60)) * scale
        if src.chance(0.5):
            kw["runtime_estimate_s"] = duration
        if cls.on_window_close == "checkpoint-and-stop":
            kw["checkpointable"] = True  # else a run longer than its window restarts for ever (as in _jobs)
        submit = float(src.integer(0, 4) if low else src.integer(5, 30)) * scale
        spec = JobSpec(id=f"j{len(jobs) + i + 1}", team=src.choice(teams), workload_class=name, gpus=gpus,
                       user=src.choice(["u1", "u2"]), submit_time=submit, **kw)
        out.append((spec, duration))
    return out


def _later_rules(src, raw: dict, scale: float) -> bool:
    """Rules added after most FOUND seeds: strict FIFO queues (note 031) - a class's, or
    a team's own of a class - deadline ordering (note 034), preemption within a team's
    quota (note 035), NVLink islands required by a class and an MPS memory cap per
    client (note 037)."""
    changed = False
    if src.chance(0.25):
        team = src.choice(sorted(raw["teams"]))
        raw["teams"][team]["preemption"] = {"within_team": "lower_priority"}
        changed = True
    if src.chance(0.15):
        prio = raw.setdefault("priority", {"recalc_s": float(src.integer(1, 20)) * scale})
        prio.setdefault("weights", {})["deadline"] = src.choice([1000.0, 1_000_000.0])
        prio["deadline_horizon_s"] = float(src.integer(10, 100)) * scale
        changed = True
    if src.chance(0.15):
        name = src.choice(["batch", "sandbox", "research-training", "training"])
        raw.setdefault("classes", {}).setdefault(name, {})["queueing"] = "strict_fifo"
        changed = True
    if src.chance(0.15):
        team = src.choice(sorted(raw["teams"]))
        name = src.choice(["batch", "sandbox", "research-training", "training"])
        raw["teams"][team].setdefault("classes", {}).setdefault(name, {})["queueing"] = "strict_fifo"
        changed = True
    types: dict[str, int] = {}
    for n in raw["cluster"]["nodes"]:
        types[n["gpu_type"]] = types.get(n["gpu_type"], 0) + n["gpus"]
    if len(types) >= 2 and src.chance(0.35):
        _per_type_quotas(src, raw, types)
        changed = True
    if src.chance(0.2):  # NVLink islands as a requirement (note 037)
        name = src.choice(["training", "batch", "research-training"])
        raw.setdefault("classes", {}).setdefault(name, {})["require_island"] = True
        changed = True
    mps = [n["sharing"]["mps"] for n in raw["cluster"]["nodes"] if "mps" in n.get("sharing", {})]
    if mps and src.chance(0.4):  # a per-client memory cap (note 037)
        src.choice(mps)["max_memory_per_client_mib"] = src.choice([4096, 8192])
        changed = True
    return changed


def _per_type_quotas(src, raw: dict, types: dict[str, int]) -> None:
    """Quotas per GPU type (note 038): some teams' ``max_gpus`` per type, and the cohort
    ``co`` with every member's nominal / borrowing / lending limits per type (GPUs no
    member is guaranteed are then the cohort's own)."""
    names = sorted(types)
    teams = raw["teams"]
    for name in sorted(teams):
        t = teams[name]
        if src.chance(0.5) and not any("max_gpus" in w for w in t.get("windows", ())):
            t["max_gpus"] = {g: src.integer(0, types[g]) for g in names if src.chance(0.7)} or {names[0]: 1}
    co = raw.get("cohorts", {}).get("co")
    if co is None or not src.chance(0.7):
        return
    left = dict(types)
    for m in co["members"]:
        teams[m].pop("nominal_gpus", None)
    reserved = sum(c.get("reserved_gpus", 0) for c in raw.get("classes", {}).values())
    budget = sum(types.values()) - reserved - sum(
        t["nominal_gpus"] for t in teams.values() if t.get("parent") is None and "nominal_gpus" in t)
    for m in co["members"]:
        t = teams[m]
        cap = t.get("max_gpus")
        nom = {}
        for g in names:
            if src.chance(0.6):
                v = min(src.integer(0, left[g]), max(0, budget))
                if isinstance(cap, dict) and g in cap:
                    v = min(v, cap[g])
                left[g] -= v
                budget -= v
                nom[g] = v
        if isinstance(cap, int) and sum(nom.values()) > cap:
            nom = {g: 0 for g in nom}
        old_bl = t.pop("borrowing_limit", None)
        t.pop("lending_limit", None)
        if nom:
            t["nominal_gpus"] = nom
            if src.chance(0.4):
                t["lending_limit"] = {g: src.integer(0, v) for g, v in nom.items()}
        else:
            t.pop("nominal_gpus", None)
        if src.chance(0.4):
            t["borrowing_limit"] = {g: src.integer(0, types[g]) for g in names if src.chance(0.7)} or {names[0]: 0}
        if not nom and "borrowing_limit" not in t:
            t["borrowing_limit"] = {names[-1]: types[names[-1]]}  # the cohort is per type: some field names one
        for entry in raw["cohorts"].get("co_inf", {}).get("members", ()):
            if entry["team"] == m:  # co_inf stays in GPUs of every type: its own numbers
                if "borrowing_limit" not in entry:  # (the whole cluster: no limit)
                    entry["borrowing_limit"] = old_bl if old_bl is not None else sum(types.values())
                entry.setdefault("lending_limit", entry["nominal_gpus"])
    _fix_children(teams)


def _fix_children(teams: dict) -> None:
    """A child's nominal quota stays within its parent's."""
    for t in teams.values():
        parent = t.get("parent")
        if parent is not None and "nominal_gpus" in t:
            pn = teams[parent].get("nominal_gpus")
            total = sum(pn.values()) if isinstance(pn, dict) else (pn or 0)
            if t["nominal_gpus"] > total:
                t["nominal_gpus"] = total


def _nodes(src) -> list[dict]:
    out = []
    for i in range(src.integer(1, 4)):
        gpus = src.choice([1, 2, 2, 4, 4, 8])
        gtype, mem, mig_ok = src.choice(GPU_TYPES)
        node: dict = {"name": f"n{i + 1}", "gpus": gpus, "gpu_type": gtype, "gpu_mem_mib": mem}
        if src.chance(0.25):
            node["pool"] = "inf"
        if src.chance(0.4):
            node["labels"] = {"zone": src.choice(["a", "b"])}
        if src.chance(0.12):
            node["taints"] = ["dedicated=ml"]
        if gpus >= 4 and src.chance(0.5):
            if gpus == 8 and src.chance(0.5):
                node["nvlink_islands"] = [[0, 1], [2, 3], [4, 5], [6, 7]]
            else:
                half = gpus // 2
                node["nvlink_islands"] = [list(range(half)), list(range(half, gpus))]
        sharing: dict = {}
        if src.chance(0.1):
            sharing["fractions"] = False
        if src.chance(0.3):
            sharing["time_slicing"] = {"replicas": src.integer(2, 4)}
        if src.chance(0.3):
            sharing["mps"] = {"max_clients": src.integer(2, 4)}
        if sharing:
            node["sharing"] = sharing
        if mig_ok and src.chance(0.35):
            n_mig = src.integer(1, min(2, gpus))
            node["mig"] = {f"g{g}": {"layout": list(src.choice(MIG_LAYOUTS))} for g in range(n_mig)}
        if src.chance(0.15):
            node["cached"] = ["llama"]
        out.append(node)
    return out


def _window(src, fields: tuple[str, ...], total: int) -> dict:
    w: dict = {"from": src.choice(EDGES_FROM), "to": src.choice(EDGES_TO)}
    if w["from"] == w["to"]:
        w["to"] = "24:00"
    if src.chance(0.2):
        w["days"] = [src.choice(["sun", "mon"])]
    if src.chance(0.3):
        w["name"] = "w"
    f = src.choice(fields)
    if src.chance(0.15):
        w[f] = 0
    else:
        w[f] = src.integer(1, total) if f.startswith("max_gpus") else src.integer(1, 3)
    return w


def _classes(src, scale: float, total: int, pools: list[str], windows_on: bool) -> dict:
    classes: dict = {}
    budget = total
    if src.chance(0.5):
        r = src.integer(1, max(1, total // 3))
        classes["production-inference"] = {"reserved_gpus": r}
        budget -= r
    if budget > 1 and src.chance(0.15):
        r = src.integer(1, max(1, budget // 4))
        classes.setdefault(src.choice(["training", "batch"]), {})["reserved_gpus"] = r
    for name in ("training", "research-training", "batch", "sandbox"):
        if src.chance(0.35):
            classes.setdefault(name, {})["grace_period_s"] = float(src.integer(1, 20)) * scale
    if src.chance(0.15):
        classes.setdefault(src.choice(["batch", "sandbox"]), {})["max_runtime_s"] = float(src.integer(20, 80)) * scale
    if src.chance(0.2):
        a, b = src.choice([("sandbox", "production-inference"), ("batch", "training"),
                           ("research-training", "sandbox")])
        classes.setdefault(a, {})["avoid_nodes_with"] = [b]
    if src.chance(0.3):
        name = src.choice(["sandbox", "batch", "research-training"])
        kinds = ["whole"] + [k for k in ("fraction", "time_slice", "mps", "mig") if src.chance(0.5)]
        classes.setdefault(name, {})["sharing"] = kinds
    if src.chance(0.15):
        name = src.choice(["batch", "sandbox", "research-training"])
        classes.setdefault(name, {})["max_gpus"] = src.integer(1, total)
    if src.chance(0.1):
        classes.setdefault("research-training", {})["max_gpus_per_user"] = src.integer(1, total)
    if src.chance(0.1):
        classes.setdefault("sandbox", {})["max_running_jobs_per_user"] = src.integer(1, 2)
    if "inf" in pools and src.chance(0.6):
        name = src.choice(["production-inference", "batch"])
        both = "default" in pools and src.chance(0.3)
        classes.setdefault(name, {})["pools"] = ["inf", "default"] if both else ["inf"]
    if windows_on:
        for _ in range(src.integer(0, 2)):
            name = src.choice(["batch", "sandbox", "research-training", "training"])
            cls = classes.setdefault(name, {})
            cls.setdefault("windows", []).append(
                _window(src, ("max_gpus", "max_gpus_per_user", "max_running_jobs_per_user"), total))
            cls["on_window_close"] = src.choice(["drain", "checkpoint-and-stop"])
            if src.chance(0.3):
                cls["max_gpus"] = src.integer(0, total)
    return classes


def _teams(src, scale: float, total: int, reserved: int, windows_on: bool, nodes: list[dict],
           classes: dict) -> tuple[dict, dict]:
    names = ["a", "b", "c"][: src.integer(1, 3)]
    teams: dict = {n: {} for n in names}
    child = "d" if src.chance(0.3) else None
    if child:
        teams[child] = {"parent": "a"}
    for t in teams.values():
        if src.chance(0.25):
            t["max_gpus"] = 0 if src.chance(0.05) else src.integer(max(1, total // 3), total)
        if src.chance(0.15):
            t["max_gpus_per_user"] = src.integer(max(1, total // 3), total)
        if src.chance(0.15):
            t["max_running_jobs"] = src.integer(2, 4)
        if src.chance(0.08):
            t["max_running_jobs_per_user"] = src.integer(1, 3)
        if src.chance(0.12):
            t["classes"] = {src.choice(["batch", "sandbox", "training"]):
                            {"max_gpus": src.integer(0, total)} if src.chance(0.6) else {"max_running_jobs": 1}}
        if windows_on and src.chance(0.3):
            t["windows"] = [_window(src, ("max_gpus", "max_gpus_per_user", "max_running_jobs",
                                          "max_running_jobs_per_user"), total)]
    cohorts: dict = {}
    budget = total - reserved  # nominal quota of top-level teams plus reservations <= the cluster
    if len(names) >= 2 and src.chance(0.6):
        members = names if len(names) == 2 or src.chance(0.5) else names[:2]
        fair = max(0, budget) // len(members)
        for m in members:
            t = teams[m]
            nom = src.integer(fair // 2, fair) if src.chance(0.85) else 0
            if "max_gpus" in t and nom > t["max_gpus"]:
                nom = t["max_gpus"]
            budget -= nom
            t["nominal_gpus"] = nom
            if src.chance(0.3):
                t["borrowing_limit"] = src.integer(0, total)
            if nom and src.chance(0.3):
                t["lending_limit"] = src.integer(0, nom)
        cohorts["co"] = {"members": members, "reclaim": src.choice(["any", "lower_priority", "never"])}
    if child and "nominal_gpus" in teams["a"] and src.chance(0.5):
        nom = src.integer(0, teams["a"]["nominal_gpus"])
        teams[child]["nominal_gpus"] = min(nom, teams[child].get("max_gpus", nom))
    inf_gpus = sum(n["gpus"] for n in nodes if n.get("pool") == "inf")
    confined = [c for c in classes.values() if c.get("pools") == ["inf"]]
    if inf_gpus and confined and src.chance(0.5):
        members = []
        left = inf_gpus
        for m in names[: src.integer(1, len(names))]:
            nom = src.integer(0, left)
            cap = teams[m].get("max_gpus")
            if cap is not None:
                nom = min(nom, cap)
            left -= nom
            entry = {"team": m, "nominal_gpus": nom}
            if "lending_limit" in teams[m]:  # the team's own applies to every cohort it is in
                entry["lending_limit"] = min(nom, teams[m]["lending_limit"])
            if src.chance(0.3):
                entry["borrowing_limit"] = src.integer(0, inf_gpus)
            members.append(entry)
        cohorts["co_inf"] = {"members": members, "pool": "inf",
                             "reclaim": src.choice(["any", "lower_priority", "never"])}
    return teams, cohorts


def _jobs(src, scale: float, raw: dict, rules) -> list[tuple[JobSpec, float]]:
    teams = list(raw["teams"])
    nodes = rules.nodes
    mig_profiles = sorted({inst.profile for n in nodes for _g, layout in n.mig for inst in layout})
    if rules.mig_reconfigure and any(n.mig for n in nodes):
        mig_profiles = sorted(set(mig_profiles) | set(MIG_PROFILES))
    offered = {"fraction": any(n.supports("fraction") for n in nodes),
               "time_slice": any(n.supports("time_slice") for n in nodes),
               "mps": any(n.supports("mps") for n in nodes), "mig": bool(mig_profiles)}
    whole = sum(n.gpus - len(n.mig) for n in nodes)
    layered = src.chance(0.5)
    out = []
    for i in range(src.integer(2, 12)):
        name = src.choice(CLASSES)
        cls = rules.classes[name]
        allowed = cls.sharing if cls.sharing is not None else ("whole",) + SHARE_KINDS
        kinds = [k for k in SHARE_KINDS if k in allowed and offered[k]]
        duration = float(src.integer(1, 60)) * scale
        kw: dict = {}
        share = None
        if kinds and src.chance(0.3):
            kind = src.choice(kinds)
            if kind == "fraction":
                if src.chance(0.3):
                    share = GpuShare("fraction", mem_mib=src.choice([10240, 20480, 40960]))
                else:
                    share = GpuShare("fraction", milli=src.choice([250, 500, 750]),
                                     mem_mib=src.choice([0, 0, 20480]))
            elif kind == "time_slice":
                share = GpuShare("time_slice", mem_mib=src.choice([8192, 16384]), slots=src.integer(1, 2))
            elif kind == "mps":
                share = GpuShare("mps", milli=src.choice([100, 250, 500]), slots=src.integer(1, 2),
                                 mem_mib=src.choice([0, 4096]))
            else:
                share = GpuShare("mig", profile=src.choice(mig_profiles))
            gpus = 1
        else:
            gpus = src.choice([1, 1, 1, 2, 2, 3, 4, 4, 6, 8])
            if gpus > whole and not src.chance(0.05):  # mostly jobs the cluster can hold
                gpus = src.integer(1, max(1, whole))
            if gpus > 1 and src.chance(0.25):
                kw["gpus_per_pod"] = src.choice([d for d in range(1, gpus) if gpus % d == 0])
            elif src.chance(0.1):
                kw["same_node"] = True
            if src.chance(0.08):
                kw["gpu_mem_mib"] = 81920
        if share is not None:
            kw["share"] = share
        if src.chance(0.3):
            limit = float(src.integer(1, 80)) * scale
            if cls.max_runtime_s is not None:
                limit = min(limit, cls.max_runtime_s)
            kw["time_limit_s"] = limit
        est = src.choice(["none", "exact", "exact", "over", "under"])
        if est == "exact":
            kw["runtime_estimate_s"] = duration
        elif est == "over":
            kw["runtime_estimate_s"] = duration * src.choice([1.5, 2.0, 4.0])
        elif est == "under":
            kw["runtime_estimate_s"] = max(1.0, duration * src.choice([0.25, 0.5]))
        pre = src.choice([None, None, True, False])
        if name == "production-inference" and pre:
            pre = None  # refused at submit: production inference is never preempted
        kw["preemptible"] = pre
        kw["checkpointable"] = src.choice([None, None, True, False])
        if cls.on_window_close == "checkpoint-and-stop" and pre is not False:
            # a window that closes stops it every day: without a checkpoint a run longer
            # than the window restarts from zero for ever (documented, note 003)
            kw["checkpointable"] = True
        if src.chance(0.1):
            kw["node_selector"] = (("zone", src.choice(["a", "b"])),)
        if src.chance(0.2):
            kw["tolerations"] = (src.choice(["dedicated=ml", "dedicated"]),)
        if src.chance(0.06):
            kw["gpu_types"] = (src.choice(sorted({n.gpu_type for n in nodes})),)
        if src.chance(0.1):
            kw["cache_key"] = "llama"
        if layered:  # lower classes first, higher ones later: preemption
            low = cls.priority < 300
            submit = float(src.integer(0, 10) if low else src.integer(5, 30)) * scale
        else:  # a burst, then more
            submit = float(src.integer(0, 10 if src.chance(0.5) else 30)) * scale
        if src.chance(0.1):
            kw["deadline"] = submit + duration * 2
        spec = JobSpec(id=f"j{i + 1}", team=src.choice(teams), workload_class=name, gpus=gpus,
                       user=src.choice(["u1", "u2"]), submit_time=submit, **kw)
        out.append((spec, duration))
    return out


def _events(src, scale: float, raw: dict, rules, n_jobs: int) -> list:
    events: list = []
    horizon = 60
    for _ in range(src.integer(0, 2)):
        events.append(JobCancelled(float(src.integer(0, horizon)) * scale, job_id=f"j{src.integer(1, n_jobs)}"))
    for _ in range(src.integer(0, 2)):
        events.append(JobRequeueRequested(float(src.integer(0, horizon)) * scale, job_id=f"j{src.integer(1, n_jobs)}"))
    by_name = {n.name: n for n in rules.nodes}
    touched: set[str] = set()  # one hardware story per node
    for _ in range(src.integer(0, 2)):
        name = src.choice(sorted(by_name))
        if name in touched:
            continue
        touched.add(name)
        t = float(src.integer(0, horizon)) * scale
        back = float(src.integer(1, 40)) * scale if src.chance(0.6) else None
        if src.chance(0.5):
            events.append(NodeLost(t, node=name))
            if back is not None:
                events.append(NodeAdded(t + back, node=by_name[name]))
        else:
            gpu = src.integer(0, by_name[name].gpus - 1)
            events.append(GpuHealthChanged(t, node=name, gpu=gpu, healthy=False))
            if back is not None:
                events.append(GpuHealthChanged(t + back, node=name, gpu=gpu, healthy=True))
    if src.chance(0.1):
        gpus = src.choice([1, 2, 4])
        events.append(NodeAdded(float(src.integer(0, horizon)) * scale,
                                node=Node("n9", gpus, "A100-80GB", 81920,
                                          nvlink_islands=((0, 1), (2, 3)) if gpus == 4 else ())))
    for _ in range(src.integer(0, 2)):
        events.append(Restart(float(src.integer(0, horizon)) * scale))
    return events

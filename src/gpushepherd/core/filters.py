"""Node filters: which nodes a job may use, and whether the inventory can ever hold it.

A job's filter key (``ckey``) gathers everything static a node must offer: the class's
pools, GPU types, minimum GPU memory, node selector, tolerations, minimum driver, a
required cache key and the kind of GPU it takes (whole or a share kind). Nodes with one
shape key (``Node.shape_key``) pass or fail a filter together, so the core filters
node groups, not nodes (Kubernetes' filter plugins, evaluated per equivalence class).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpushepherd.model.cluster import Node
from gpushepherd.model.job import GpuShare, JobSpec
from gpushepherd.model.mig import MigError, profiles_for
from gpushepherd.model.rules import ClassRules

_VERSION_PART = re.compile(r"\d+")


def version_key(text: str) -> tuple[int, ...]:
    """``"535.104.05"`` -> ``(535, 104, 5)``: driver versions compare part by part as
    numbers (``535.54`` < ``535.104``)."""
    return tuple(int(p) for p in _VERSION_PART.findall(text))


def taint_key(taint: str) -> str:
    """``gpu=inference:NoSchedule`` -> ``gpu``."""
    return taint.split(":", 1)[0].split("=", 1)[0]


def tolerates(taints: Iterable[str], tolerations: Iterable[str]) -> bool:
    """Whether every taint is tolerated: a toleration equal to the taint (``key=value``,
    Kubernetes' ``Equal``) or naming only its key (``Exists``)."""
    tol = set(tolerations)
    for taint in taints:
        plain = taint.split(":", 1)[0]
        if plain not in tol and taint not in tol and taint_key(taint) not in tol:
            return False
    return True


def job_filter(cls: ClassRules, spec: JobSpec) -> tuple:
    """The filter key of a job of class ``cls``."""
    kind = spec.share.kind if spec.share is not None else "whole"
    return (cls.pools, tuple(sorted(spec.gpu_types)), spec.gpu_mem_mib, tuple(sorted(spec.node_selector)),
            tuple(sorted(spec.tolerations)), spec.min_driver, spec.cache_key if spec.cache_required else "", kind)


def node_ok(node: Node, ckey: tuple) -> bool:
    """Whether ``node`` passes the filter ``ckey`` (static properties only)."""
    pools, types, mem, selector, tolerations, min_driver, cache, kind = ckey
    if pools is not None and node.pool not in pools:
        return False
    if types and node.gpu_type not in types:
        return False
    if node.gpu_mem_mib < mem:
        return False
    for key, value in selector:
        if node.label(key) != value:
            return False
    if node.taints and not tolerates(node.taints, tolerations):
        return False
    if min_driver and (not node.driver or version_key(node.driver) < version_key(min_driver)):
        return False
    if cache and cache not in node.cached:
        return False
    return node.supports(kind)


def whole_gpus(node: Node) -> int:
    """GPUs of the node that can be handed out whole (MIG GPUs never are)."""
    return node.gpus - len(node.mig)


def share_fits_card(node: Node, share: GpuShare, reconfigurable: bool = False) -> bool:
    """Whether one empty card of ``node`` could hold ``share`` (MIG: some card's layout
    has the profile, or - ``reconfigurable`` - its GPU model offers the profile)."""
    if share.kind == "mig":
        if reconfigurable and node.mig:
            try:
                return share.profile in profiles_for(node.gpu_type)
            except MigError:
                return False
        return any(inst.profile == share.profile for _g, layout in node.mig for inst in layout)
    milli, mem, slots = share.need(node)
    if milli > 1000 or mem > node.gpu_mem_mib:
        return False
    if share.kind == "time_slice":
        return slots <= node.ts_replicas
    if share.kind == "mps":  # within its clients, and a per-client memory cap (note 037)
        return slots <= node.mps_clients and not (node.mps_mem_mib and share.mem_mib > node.mps_mem_mib)
    return True


def share_can_join(node: Node, share: GpuShare) -> bool:
    """Whether ``share`` could join a card of ``node`` another job opened: it leaves room
    for at least one other client there (it does not need all of the card's clients,
    time-slice replicas, compute or memory). Not for ``mig``."""
    milli, mem, slots = share.need(node)
    if not share_fits_card(node, share) or milli >= 1000 or mem >= node.gpu_mem_mib:
        return False
    if share.kind == "time_slice":
        return slots < node.ts_replicas
    if share.kind == "mps":
        return slots < node.mps_clients
    return True


def describe(cls: ClassRules, spec: JobSpec) -> str:
    """The job's constraints in the policy's words, for reasons and rejections."""
    parts = []
    if spec.share is not None:
        parts.append(f"share={spec.share}")
    else:
        parts.append(f"gpus={spec.gpus}")
    if cls.pools is not None:
        parts.append("pools=" + "|".join(cls.pools))
    if spec.gpu_types:
        parts.append("gpu_types=" + "|".join(spec.gpu_types))
    if spec.gpu_mem_mib:
        parts.append(f"gpu_mem_mib>={spec.gpu_mem_mib}")
    for k, v in spec.node_selector:
        parts.append(f"node_selector.{k}={v}")
    if spec.min_driver:
        parts.append(f"min_driver={spec.min_driver}")
    if spec.cache_required:
        parts.append(f"cache={spec.cache_key}")
    return ",".join(parts)


def needs_island(cls: ClassRules, spec: JobSpec) -> bool:
    """Whether the job's GPUs must lie in one NVLink island of one node: its own
    ``require_island``, else its class's; never for a share or a gang of pods (note 037)."""
    if spec.share is not None or spec.gpus < 2:
        return False
    if spec.gpus_per_pod and spec.gpus_per_pod < spec.gpus and not spec.same_node:
        return False
    return cls.require_island if spec.require_island is None else spec.require_island


def largest_island(node: Node) -> int:
    """The most whole GPUs of ``node`` inside one NVLink island (a node that declares
    no islands is one island of all its GPUs; note 037)."""
    if not node.nvlink_islands:
        return whole_gpus(node)
    mig = {g for g, _layout in node.mig}
    return max((sum(1 for g in island if g not in mig) for island in node.nvlink_islands), default=0)


def inventory_misfit(nodes: Iterable[Node], cls: ClassRules, spec: JobSpec, ckey: tuple,
                     reconfigurable: bool = False) -> str | None:
    """Why no node of ``nodes`` could ever hold the job, even all idle; ``None`` when one
    could (``reconfigurable``: MIG GPUs may be re-partitioned). Whole-GPU gangs are
    checked by count here; the core checks their layout."""
    nodes = list(nodes)
    eligible = [n for n in nodes if node_ok(n, ckey)]
    if not eligible:
        if spec.share is not None and not any(n.supports(spec.share.kind) for n in nodes):
            return f"share={spec.share}: {share_offer(nodes, spec.share)}"
        return "no node offers " + describe(cls, spec) + _inventory_summary(nodes)
    if spec.share is not None:
        if not any(share_fits_card(n, spec.share, reconfigurable) for n in eligible):
            return f"no GPU can hold share={spec.share}: {share_offer(eligible, spec.share, reconfigurable)}"
        return None
    if spec.one_node and not any(whole_gpus(n) >= spec.gpus for n in eligible):
        why = "same_node" if spec.same_node else f"gpus_per_pod={spec.gpus_per_pod}"
        return f"gpus={spec.gpus},{why}: at most {max(whole_gpus(n) for n in eligible)} on one node"
    if needs_island(cls, spec) and not any(largest_island(n) >= spec.gpus for n in eligible):
        return (f"gpus={spec.gpus},require_island: at most {max(largest_island(n) for n in eligible)} in one NVLink "
                "island")
    total = sum(whole_gpus(n) for n in eligible)
    if spec.gpus > total:
        return f"gpus={spec.gpus}: the nodes it may use have {total} in all"
    return None


def _by_value(pairs: list[tuple[object, str]], most: int = 3) -> str:
    """``[(value, node name)]`` as ``4 (n1, n2), 2 (n3)``: values from the largest, at most
    ``most`` names each (``+K more``)."""
    groups: dict = {}
    for value, name in pairs:
        groups.setdefault(value, []).append(name)
    out = []
    for value in sorted(groups, reverse=True):
        names = groups[value]
        more = f", +{len(names) - most} more" if len(names) > most else ""
        out.append(f"{value} ({', '.join(names[:most])}{more})")
    return ", ".join(out)


def share_offer(nodes: list[Node], share: GpuShare, reconfigurable: bool = False) -> str:
    """What the nodes a share may use offer of its kind, for the refusal of a share no
    GPU of them can hold: the allowed values and the nodes' policy fields
    (``sharing.time_slicing.replicas``, ``sharing.mps.max_clients``, GPU memory, MIG
    profiles), e.g. ``time_slice takes at most 4 replicas: sharing.time_slicing.replicas
    per GPU is 4 (local)``; ``reconfigurable``: MIG GPUs may be re-partitioned (any
    profile of their model is offered)."""
    kind = share.kind
    offering = [n for n in nodes if n.supports(kind)]
    if not offering:
        return f"no node offers {kind} shares" + _inventory_summary(nodes)
    mem = max(n.gpu_mem_mib for n in offering)
    memory = f"; GPU memory per GPU, MiB: {_by_value([(n.gpu_mem_mib, n.name) for n in offering])}" if mem else ""
    if kind == "time_slice":
        most = max(n.ts_replicas for n in offering)
        return (f"time_slice takes at most {most} replica{'s' * (most != 1)}: sharing.time_slicing.replicas per GPU "
                f"is {_by_value([(n.ts_replicas, n.name) for n in offering])}{memory}")
    if kind == "mps":
        most = max(n.mps_clients for n in offering)
        caps = [(n.mps_mem_mib, n.name) for n in offering if n.mps_mem_mib]
        cap = f"; sharing.mps.max_memory_per_client_mib is {_by_value(caps)}" if caps else ""
        return (f"mps takes at most {most} replica{'s' * (most != 1)}: sharing.mps.max_clients per GPU is "
                f"{_by_value([(n.mps_clients, n.name) for n in offering])}{cap}{memory}")
    if kind == "mig":
        profiles = sorted({inst.profile for n in offering for _g, layout in n.mig for inst in layout})
        if reconfigurable:
            for n in offering:
                try:
                    profiles = sorted(set(profiles) | set(profiles_for(n.gpu_type)))
                except MigError:
                    pass
        return f"the MIG profiles of the nodes it may use are {', '.join(profiles)}"
    return f"a fraction takes at most 1000 milli-GPU and the memory of one GPU{memory}"


def _inventory_summary(nodes: list[Node]) -> str:
    kinds = sorted({(n.gpu_type, n.gpu_mem_mib) for n in nodes})
    if not kinds:
        return " (no nodes)"
    shown = ", ".join(f"{t}/{m} MiB" if m else t for t, m in kinds[:6])
    return f" (the cluster has {shown}{', ...' if len(kinds) > 6 else ''})"

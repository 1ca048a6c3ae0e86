"""Placement of whole-GPU jobs: which node(s), how many GPUs on each.

Rules (the public scenario conventions; Slurm's select/cons_tres packs the same way):

* ``single`` - the job fits one node (or must: ``same_node``): the node with the
  fewest free GPUs that still fits it (bin-packing), ties by lowest node index. Every
  feasible node is considered, not only the tightest one that is tried first.
* ``multi`` - the job is larger than any node it may use: whole free nodes (largest
  first, then lowest index) plus at most one remainder node chosen by bin-packing, so
  that the gang spans the fewest nodes.
* ``pods`` - a gang of ``pods`` x ``per_pod`` GPUs: each pod on one node by
  bin-packing, pods may share a node; all or nothing.

Placement works on counts; which GPU indices of a node are given is the ledger's
business (lowest free index first). The same functions place on the live ledger and
on the scratch availability maps of reservations, so a plan and a start agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpushepherd.core.ledger import Ledger, lowest_bits
from gpushepherd.model.job import GpuShare

Counts = list[tuple[int, int]]  # [(node index, GPUs on it)]


@dataclass(frozen=True, slots=True)
class Shape:
    """How a job's GPUs must be laid out. ``ckey`` keys the job's node filter;
    ``mode`` ``share``: part of one GPU (``share``). ``island``: a ``single`` job whose
    ``k`` GPUs must lie in one NVLink island of its node (``require_island``, note 037;
    a node that declares no islands is one island of all its GPUs)."""

    k: int
    mode: str  # "single" | "multi" | "pods" | "share"
    per_pod: int
    pods: int
    ckey: tuple
    share: GpuShare | None = None
    island: bool = False


def best_fit_counts(avail: dict[int, int], candidates: list[int], k: int) -> int | None:
    """Index of the candidate with the fewest available GPUs >= ``k`` (ties: lowest index)."""
    best = None
    best_free = 0
    for idx in candidates:
        f = avail.get(idx, 0)
        if f >= k and (best is None or f < best_free or (f == best_free and idx < best)):
            best, best_free = idx, f
    return best


def place_counts(avail: dict[int, int], candidates: list[int], totals: dict[int, int], shape: Shape) -> Counts | None:
    """Place ``shape`` on ``avail`` (free GPUs per node index) among ``candidates``.

    ``totals`` gives each node's healthy GPU count (a "whole free node" has
    ``avail == totals``). Returns ``[(node, count)]`` or ``None`` when it does not fit.
    """
    if shape.mode == "single":
        idx = best_fit_counts(avail, candidates, shape.k)
        return None if idx is None else [(idx, shape.k)]
    if shape.mode == "pods":
        scratch = dict(avail)
        used: dict[int, int] = {}
        for _ in range(shape.pods):
            idx = best_fit_counts(scratch, candidates, shape.per_pod)
            if idx is None:
                return None
            scratch[idx] -= shape.per_pod
            used[idx] = used.get(idx, 0) + shape.per_pod
        return list(used.items())
    # multi: whole free nodes, largest first, then one remainder node by best fit
    # (written out: a reservation's walk places multi-node jobs often, note 055)
    whole = []
    for i in candidates:
        a = avail.get(i, 0)
        if a > 0 and a >= totals[i]:
            whole.append((-a, i))
    whole.sort()
    chosen: Counts = []
    rem = shape.k
    taken = set()
    for neg, idx in whole:
        if -neg <= rem:
            chosen.append((idx, -neg))
            taken.add(idx)
            rem += neg
            if rem == 0:
                return chosen
    best = None
    best_free = 0
    for idx in candidates:  # best_fit_counts over the nodes not taken
        f = avail.get(idx, 0)
        if f >= rem and (best is None or f < best_free or (f == best_free and idx < best)) and idx not in taken:
            best, best_free = idx, f
    if best is None:
        return None
    chosen.append((best, rem))
    return chosen


def place_live(ledger: Ledger, groups: list[int], shape: Shape) -> Counts | None:
    """Place ``shape`` on the ledger's free GPUs among the nodes of ``groups``.

    Same rule as ``place_counts`` on the ledger's free counts; ``single`` uses the
    free-count buckets (no scan over nodes).
    """
    if shape.mode == "single":
        k = shape.k
        if len(groups) == 1:  # one shape group: the first node of its first bucket from k up
            grp = ledger.groups[groups[0]]
            for bucket in grp.buckets[k:grp.gpus + 1]:
                if bucket:
                    return [(bucket[0], k)]
            return None
        idx = ledger.best_fit(groups, k)
        return None if idx is None else [(idx, k)]
    if shape.mode == "multi" and all(ledger.groups[g].healthy_sum == len(ledger.groups[g].members) * ledger.groups[g].gpus
                                     for g in groups):
        return _multi_from_buckets(ledger, groups, shape.k)
    candidates = members_of(ledger, groups)
    avail = {i: ledger.slots[i].free for i in candidates}
    totals = {i: ledger.slots[i].healthy for i in candidates}
    return place_counts(avail, candidates, totals, shape)


def _multi_from_buckets(ledger: Ledger, groups: list[int], k: int) -> Counts | None:
    """``place_counts``'s multi rule on fully healthy groups, from the free-count
    buckets: whole free nodes largest first (then lowest index), then the tightest
    remainder node."""
    whole: list[tuple[int, int]] = []
    for g in groups:
        grp = ledger.groups[g]
        whole.extend((-grp.gpus, idx) for idx in grp.buckets[grp.gpus])
    whole.sort()
    chosen: Counts = []
    rem = k
    for neg, idx in whole:
        size = -neg
        if size <= rem:
            chosen.append((idx, size))
            rem -= size
            if rem == 0:
                return chosen
    hit = tightest_in_buckets(ledger, groups, rem, {i for i, _ in chosen})
    if hit is None:
        return None
    chosen.append((hit[1], rem))
    return chosen


def tightest_in_buckets(ledger: Ledger, groups: list[int], k: int, exclude, upto: int | None = None
                        ) -> tuple[int, int] | None:
    """``(free GPUs, node index)`` of the node of ``groups`` with the fewest free GPUs
    that still hold ``k`` (then the lowest index), from the free-count buckets; nodes in
    ``exclude`` aside, and none with more than ``upto`` free GPUs when given. ``None``
    when no node qualifies."""
    top = max((ledger.groups[g].gpus for g in groups), default=0)
    if upto is not None:
        top = min(top, upto)
    for f in range(k, top + 1):
        found = None
        for g in groups:
            grp = ledger.groups[g]
            if f <= grp.gpus:
                for idx in grp.buckets[f]:
                    if idx not in exclude:
                        if found is None or idx < found:
                            found = idx
                        break
        if found is not None:
            return f, found
    return None


def members_of(ledger: Ledger, groups: list[int]) -> list[int]:
    out: list[int] = []
    for g in groups:
        out.extend(ledger.groups[g].members)
    out.sort()
    return out


def fits_island(free_mask: int, k: int, islands: tuple[tuple[int, ...], ...]) -> bool:
    """Whether ``k`` GPUs of ``free_mask`` fit one NVLink island (no islands declared:
    the node is one island, so yes)."""
    if not islands:
        return True
    for island in islands:
        n = 0
        for g in island:
            n += free_mask >> g & 1
        if n >= k:
            return True
    return False


def best_fit_island(avail: dict[int, int], candidates: list[int], k: int, slots, masks) -> Counts | None:
    """Single-node best fit (fewest GPUs left, then lowest index) among the candidates
    where ``k`` GPUs fit one NVLink island: ``masks`` is ``True`` for each node's GPUs
    in service, else a ``{node: mask}`` of the GPUs to fit in (note 037). ``slots``: the
    ledger's node slots."""
    best = None
    for i in candidates:
        f = avail.get(i, 0)
        if f < k or (best is not None and (f, i) >= best):
            continue
        mask = slots[i].healthy_mask if masks is True else masks[i]
        if fits_island(mask, k, slots[i].node.nvlink_islands):
            best = (f, i)
    return None if best is None else [(best[1], k)]


def pick_gpus(free_mask: int, k: int, islands: tuple[tuple[int, ...], ...]) -> int:
    """Which ``k`` free GPUs of a node a job gets, as a mask.

    Without NVLink islands: the lowest free indices (the conventions' rule). With
    islands: the island with the fewest free GPUs that still holds all ``k`` (ties:
    lowest first index), so that a multi-GPU job stays on one island and single-GPU
    jobs fill broken islands first, keeping whole pairs for the jobs that need them
    (the topology rule of Kubernetes' TopologyManager and KAI's topology plugin);
    when no island holds ``k``, the fullest islands' GPUs are taken first.
    """
    if not islands:
        return lowest_bits(free_mask, k)
    best = None
    for island in islands:
        mask = 0
        for g in island:
            mask |= 1 << g
        free = (free_mask & mask).bit_count()
        if free >= k and (best is None or (free, island[0]) < best[0]):
            best = ((free, island[0]), free_mask & mask)
    if best is not None:
        return lowest_bits(best[1], k)
    # spread: islands with the most free GPUs first, then GPUs outside any island
    order = []
    inside = 0
    for island in islands:
        mask = 0
        for g in island:
            mask |= 1 << g
        inside |= mask
        order.append((-(free_mask & mask).bit_count(), island[0], free_mask & mask))
    order.sort()
    out = 0
    for _neg, _first, mask in order + [(0, 0, free_mask & ~inside)]:
        take = min(k - out.bit_count(), mask.bit_count())
        out |= lowest_bits(mask, take)
        if out.bit_count() == k:
            break
    return out

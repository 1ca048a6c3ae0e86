"""Stranded capacity: free GPU capacity that no pending job could use now (R11).

A queue that grows while GPUs sit free is the symptom of placement constraints: a GPU
type nobody pending asks for, one free GPU on each of two nodes for a job that needs
both on one node, 0.1 of a card left for jobs that want 0.5. This module measures it.

Definitions (all in GPUs; a share of a card in milli-GPU / 1000, a free MIG instance as
its compute slices / 7):

* *free*: healthy whole GPUs nobody holds (an unmanaged GPU - foreign processes on it -
  is out of service, neither free nor stranded), the unused part of shared cards (the
  tightest of compute, memory and replicas/clients left), free MIG instances - on live
  nodes; a MIG GPU being re-partitioned is out of service, not free.
* *usable*: some pending job could take it if it were first in line - its filters
  (pool, type, memory, selector, taints, driver, cache, sharing kind) admit the node and
  the piece is big enough (a single-node job: the node's free GPUs; a share: the card's
  room; a MIG job: an instance of its profile). Quotas are not looked at: a GPU a job
  may not take for its quota is idle by policy, not stranded by placement.
* *stranded*: free and not usable while at least one job is pending. With nothing
  pending, free capacity is idle, not stranded.

Each stranded piece is attributed to the constraint that strands it for the pending
job first in line that could otherwise use the node's kind of capacity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpushepherd.core.filters import node_ok, share_fits_card
from gpushepherd.core.placement import fits_island
from gpushepherd.model.job import JobState
from gpushepherd.model.mig import MigError, profile as mig_profile

if TYPE_CHECKING:  # pragma: no cover
    from gpushepherd.core.scheduler import Scheduler

#: names of the filter key's parts, in ``filters.job_filter`` order
_FILTER_NAMES = ("pool", "gpu_type", "gpu_memory", "node_selector", "taint", "driver", "cache", "sharing")


def stranded_capacity(sched: "Scheduler") -> dict:
    """Free and stranded GPU capacity now.

    Returns ``{"free_gpus": float, "stranded_gpus": float, "pending_jobs": int,
    "by_constraint": {name: GPUs}}``; constraint names: a filter part (``gpu_type``,
    ``pool``, ``gpu_memory``, ``node_selector``, ``taint``, ``driver``, ``cache``,
    ``sharing``), ``single-node`` (free GPUs on a node fewer than a job needs on one),
    ``share-size`` (a card's room smaller than any pending share of its mode),
    ``mig-profile`` (a free instance of a profile nobody pending wants).
    Cost: O(free pieces x distinct pending demands).
    """
    ledger = sched.ledger
    demands: dict[tuple, object] = {}
    pending = 0
    for job in sched.jobs.values():
        if job.state is not JobState.PENDING:
            continue
        pending += 1
        shape = job.shape
        key = (shape.ckey, shape.mode, shape.per_pod if shape.mode != "multi" else 1, shape.share)
        if key not in demands or job.key < demands[key].key:
            demands[key] = job
    order = sorted(demands.values(), key=lambda j: j.key)
    free = 0.0
    stranded = 0.0
    by: dict[str, float] = {}

    def strand(amount: float, why: str) -> None:
        nonlocal stranded
        stranded += amount
        by[why] = by.get(why, 0.0) + amount

    for slot in ledger.slots:
        if not slot.alive:
            continue
        node = slot.node
        ok = [j for j in order if node_ok(node, j.shape.ckey)]
        # whole free GPUs
        if slot.free:
            free += slot.free
            if order:
                usable = any(
                    (j.shape.mode == "share" and j.share.kind != "mig" and share_fits_card(node, j.share))
                    or (j.shape.mode == "single" and slot.free >= j.shape.k
                        and (not j.shape.island or fits_island(slot.free_mask, j.shape.k, node.nvlink_islands)))
                    or (j.shape.mode == "pods" and slot.free >= j.shape.per_pod)
                    or j.shape.mode == "multi"
                    for j in ok)
                if not usable:
                    strand(slot.free, _why_not(order, ok, node))
        # the room left on shared cards
        for gpu in sorted(slot.cards):
            card = slot.cards[gpu]
            if not card.key:  # an unhealthy card takes no new shares
                continue
            room = card.room_fraction()
            if room <= 0:
                continue
            free += room
            if order and not any(j.shape.mode == "share" and j.share.kind == card.mode
                                 and card.fits(*j.share.need(node)) for j in ok):
                strand(room, "share-size" if any(j.shape.mode == "share" and j.share.kind == card.mode for j in ok)
                       else _why_not(order, [j for j in ok if j.shape.mode == "share"], node, "sharing"))
        # free MIG instances
        for gpu in sorted(slot.migs):
            card = slot.migs[gpu]
            if not card.in_service:  # unhealthy, unmanaged or being re-partitioned: not free
                continue
            for pos, inst in enumerate(card.layout):
                if card.holders[pos] is not None:
                    continue
                piece = _mig_fraction(node.gpu_type, inst.profile)
                free += piece
                if order and not any(j.shape.mode == "share" and j.share.kind == "mig"
                                     and j.share.profile == inst.profile for j in ok):
                    strand(piece, "mig-profile")
    return {"free_gpus": round(free, 6), "stranded_gpus": round(stranded, 6), "pending_jobs": pending,
            "by_constraint": {k: round(v, 6) for k, v in sorted(by.items())}}


def _why_not(order: list, ok: list, node, default: str = "single-node") -> str:
    """The constraint that keeps the first pending job off ``node`` (a filter part), or
    ``default`` when its filters admit the node but the free piece is too small."""
    if ok:
        return default
    ckey = order[0].shape.ckey
    if not node.supports(ckey[7]):
        return "sharing"
    for i, name in enumerate(_FILTER_NAMES[:7]):
        part = [None, (), 0, (), (), "", "", ckey[7]]
        part[i] = ckey[i]
        if not node_ok(node, tuple(part)):
            return name
    return default


def _mig_fraction(gpu_type: str, profile: str) -> float:
    try:
        return mig_profile(gpu_type, profile).compute_slices / 7
    except MigError:  # pragma: no cover - layouts are validated on load
        return 0.0

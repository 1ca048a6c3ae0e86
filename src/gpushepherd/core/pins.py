"""The GPUs a preemptor's hold keeps by name (design note 054; oracle seed 10002).

A hold counts GPUs per node (``Profile.add_hold``): others may start on its node as long
as enough GPUs stay free for it. For most preemptors any GPUs of the node will do. One
that requires one NVLink island (``require_island``, note 037) needs the GPUs its plan
picked (``Job.hold_gpus``: one island, its victims' GPUs among them): a job that took one
of them - a smaller job preferring that island, say - left it a count but no island
once its victims were gone, and it waited ``NoFit(nvlink-island)``. Such a hold *pins*
its GPUs: it takes every pinned GPU free now (``free_pinned``), others are placed and checked for
an island on the free GPUs outside the pins (the admission rule's claims step, rule 9:
the hold is the blocker), and their GPUs are picked outside them (``pick_free``).
"""

from __future__ import annotations

from gpushepherd.core.placement import fits_island, pick_gpus
from gpushepherd.core.state import Job


def pins(book, p: Job, n: int) -> int:
    """The GPUs of node ``n`` preemptor ``p``'s hold keeps by name, as a mask: those its
    plan picked when it requires one NVLink island and the node has islands, else 0."""
    if not p.shape.island or p.shape.k < 2 or not book.ledger.slots[n].node.nvlink_islands:
        return 0
    return p.hold_gpus.get(n, 0)


def free_pinned(book, p: Job, n: int) -> int:
    """How many of the GPUs ``p`` pins on node ``n`` are free now: its hold takes them
    all now (its count alone would let another job take one of them)."""
    return (pins(book, p, n) & book.ledger.slots[n].free_mask).bit_count()


def pinned(book, profile, job: Job, exempt: tuple = ()) -> tuple[dict[int, int], dict[int, object]]:
    """``(node -> mask, node -> first hold)``: the GPUs the holds in ``profile`` other
    than ``job``'s own (and those in ``exempt``) keep by name, and per node the first
    such hold (the blocker of a job they refuse)."""
    masks: dict[int, int] = {}
    first: dict[int, object] = {}
    for c in profile.claims:
        if not c.hold or c.job_id == job.id or c in exempt:
            continue
        p = book.jobs[c.job_id]
        for n in p.hold_gpus:
            m = pins(book, p, n)
            if m:
                masks[n] = masks.get(n, 0) | m
                first.setdefault(n, c)
    return masks, first


def unpinned(book, idx: int, k: int, job: Job | None, free: int) -> int:
    """``free`` (a mask of node ``idx``) less the GPUs other preemptors pin there, when
    ``k`` GPUs are left (the admission rule counted them); else ``free``."""
    held = 0
    for p in book.preemptors.values():
        if p is not job:
            held |= pins(book, p, idx)
    rest = free & ~held
    return rest if held and rest.bit_count() >= k else free


def pick_free(book, idx: int, k: int, job: Job | None = None) -> int:
    """``pick_gpus`` of ``k`` of node ``idx``'s free GPUs for ``job``, as a mask: no GPU
    another hold pins while ``k`` others are free (``unpinned``; the admission rule counted
    them, so the fallback to every free GPU is never taken by a start it admitted); outside every GPU other preemptors' plans
    picked there when enough others are free (on one NVLink island if the free GPUs have
    one that takes ``k``), so that a count-only hold starts on the GPUs it planned."""
    slot = book.ledger.slots[idx]
    islands = slot.node.nvlink_islands
    free = unpinned(book, idx, k, job, slot.free_mask)
    held = 0
    for p in book.preemptors.values():
        if p is not job:
            held |= p.hold_gpus.get(idx, 0)
    rest = free & ~held
    if held and rest.bit_count() >= k and (fits_island(rest, k, islands) or not fits_island(free, k, islands)):
        free = rest
    return pick_gpus(free, k, islands)

"""What evicting a set of running jobs frees, in whole GPUs (issue 13 point 1; design
note 042): shared by the victim search (``preemption.py``), the scratch state the
admission rule is asked on (``admission.Scratch``) and a preemptor's hold
(``profile.Profile.add_hold``), so that all three count the same GPUs.

A whole-GPU victim frees its GPUs in service. A share (a fraction, a memory slice, a
time-slice replica, an MPS client) frees nothing by itself: the GPU its card is on
comes free only when *every* holder of the card is gone. A MIG instance never frees a
whole GPU (a MIG GPU is never handed out whole) and is no class-preemption victim.
"""

from __future__ import annotations

from gpushepherd.core.state import Job
from gpushepherd.model.job import JobState


def share_victim(job: Job) -> bool:
    """Whether ``job``, a share, may be a victim of class preemption: any share but a
    MIG instance (note 042; whole-GPU jobs are always of a victim kind)."""
    return job.share is None or job.share.kind != "mig"


def card_of(job: Job) -> tuple[int, int] | None:
    """``(node index, GPU)`` of the shared card a running share (not MIG) holds, else
    ``None`` (a whole-GPU job, a MIG instance, a job holding nothing)."""
    if job.share is None or len(job.share_at) != 1 or not job.alloc:
        return None
    return job.alloc[0][0], job.share_at[0]


def freed_parts(ledger, victims) -> list[tuple[int, int, float]]:
    """``(node index, GPU mask, planned end)`` per part ``victims`` free: each whole-GPU
    victim's GPUs in service on each node (its own planned end), and the GPU of each
    shared card in service all of whose holders are victims (the latest holder's planned
    end). Victims in the given order; cards after them by ``(node, GPU)``."""
    out: list[tuple[int, int, float]] = []
    cards: dict[tuple[int, int], float] = {}
    ids = None
    for v in victims:
        if v.share is None:
            for idx, mask in v.alloc:
                m = mask & ledger.slots[idx].healthy_mask
                if m:
                    out.append((idx, m, v.end_est))
            continue
        where = card_of(v)
        if where is None:
            continue
        if where in cards:
            cards[where] = max(cards[where], v.end_est)
            continue
        idx, g = where
        slot = ledger.slots[idx]
        card = slot.cards.get(g)
        if card is None or not slot.healthy_mask >> g & 1:
            continue
        if ids is None:
            ids = {x.id for x in victims}
        if all(h in ids for h in card.holders):
            cards[where] = v.end_est
    for (idx, g), end in sorted(cards.items()):
        out.append((idx, 1 << g, end))
    return out


def freed_masks(ledger, victims) -> dict[int, int]:
    """Per node index, the mask of whole GPUs in service ``victims`` free (``freed_parts``)."""
    out: dict[int, int] = {}
    for idx, m, _end in freed_parts(ledger, victims):
        out[idx] = out.get(idx, 0) | m
    return out


def freed_count(ledger, victims) -> int:
    """The whole GPUs in service ``victims`` free, all nodes together."""
    return sum(m.bit_count() for _idx, m, _end in freed_parts(ledger, victims))


def card_relief(ledger, victims, freed: dict[int, int]) -> dict[tuple[int, int], tuple[int, int, int]]:
    """Per shared card some (not all: those are in ``freed``, node -> mask) holders of
    which are ``victims``: the ``(milli, MiB, slots)`` they give back, summed."""
    out: dict[tuple[int, int], tuple[int, int, int]] = {}
    for v in victims:
        where = card_of(v)
        if where is None or freed.get(where[0], 0) >> where[1] & 1:
            continue
        card = ledger.slots[where[0]].cards.get(where[1])
        need = card.holders.get(v.id) if card is not None else None
        if need is None:
            continue
        had = out.get(where, (0, 0, 0))
        out[where] = (had[0] + need[0], had[1] + need[1], had[2] + need[2])
    return out


def lower_cards(book, idx: int, prio: int) -> int:
    """The mask of shared cards in service on node ``idx`` all of whose holders are
    RUNNING jobs of a class priority below ``prio`` (evictable or not): GPUs that
    evicting every lower job would free (the test behind ``NoPreemptibleVictims``)."""
    slot = book.ledger.slots[idx]
    mask = 0
    for g, card in slot.cards.items():
        if slot.healthy_mask >> g & 1 and card.holders and all(
                (h := book.jobs.get(hid)) is not None and h.state is JobState.RUNNING and h.cls.priority < prio
                for hid in card.holders):
            mask |= 1 << g
    return mask


def quota_freed(victims: list[Job], k: tuple[int, str], p: float, claims: list) -> int:
    """What a preemption plan's ``victims`` give back of quota key ``k`` (``(limit index,
    user)``) at claim point ``p``: the charges to ``k`` of those planned to hold it past
    ``p`` (the claims' spare there counts them: ``Profile._qspare_fresh``), and only when
    ``claims`` (those of ``k`` active at ``p`` that bind the plan's job) is empty. Then
    the spare at ``p`` is the running jobs' alone, and with the victims' charges back it
    is never tighter than the room now. Where a claim binds, nothing comes back: a victim
    is queued again under its own key, and one that ranks ahead of the claim's job when
    it is requeued may take the quota back first - the eviction then bought the claim
    nothing (note 067). Its rank then cannot be read from its key now: a running job's
    key is not recalculated (``priority.maybe_recalc`` rekeys the queue), and age,
    the aged tier and fair-share move it once it is queued again."""
    if claims:
        return 0
    return sum(a for v in victims if v.end_est > p for i, user, a in v.run_charges if (i, user) == k)


def reserved_at_exit(book, victims: list[Job], freed_n: int,
                     exit_: float | None = None) -> tuple[dict[str, int], int, frozenset[str]] | None:
    """Rule 8 at the exit of ``victims`` (``now + stop_grace``, the latest; note 090):
    the jobs of classes with ``reserved_gpus``, victims aside, planned to end by then
    (``end_est``) cover nothing there. ``(class -> GPU units they hold, whole GPUs they
    free beyond the ``freed_n`` the victims free, their ids)``, or ``None`` where no such
    job runs. ``exit_``: the exit when the victims were signalled already (a hold's:
    their deadlines, ``end_est``). A MIG instance frees no whole GPU: its class's reservation is then short at
    the exit though covered now (oracle seed 515973). A job already past its planned end
    (``end_est <= now``: a short estimate) is not foreseen to end: it may run for ever
    (review of note 090)."""
    if not book.reserved or not victims:
        return None
    now = book.now
    gone = max(now + v.stop_grace for v in victims) if exit_ is None else exit_
    ids = {v.id for v in victims}
    # a job past its planned end (an estimate that was short) runs on: no end to foresee
    early = [j for name in book.reserved for j in book.class_jobs.get(name, {}).values()
             if now < j.end_est <= gone and j.id not in ids]
    if not early:
        return None
    units: dict[str, int] = {}
    for j in early:
        units[j.cls.name] = units.get(j.cls.name, 0) + j.run_units
    return units, freed_count(book.ledger, [*victims, *early]) - freed_n, frozenset(j.id for j in early)

"""Would evicting *every* lower-priority running job make room for a pending job? The
test behind ``NoPreemptibleVictims`` (``reasons.capacity_reason``): when it would, but no
preemption plan exists, the job's blocker is work that may not be evicted (or not yet);
when it would not, the blocker is capacity, a card's room or another class's
``reserved_gpus``, and the reason says that instead (issue 20 point 12; notes 037, 042).
"""

from __future__ import annotations

from gpushepherd.core.freed import lower_cards
from gpushepherd.core.placement import best_fit_island, members_of, place_counts
from gpushepherd.core.preemption import candidates, card_set, comes_of_age
from gpushepherd.core.state import Job
from gpushepherd.model.job import GPU_UNITS, JobState


def lower_jobs_would_make_room(book, job: Job) -> bool:
    """Whether evicting *every* lower-priority running job (evictable or not) would make
    ``job`` fit: then its blocker is "no preemptible victims", not capacity."""
    ledger = book.ledger
    cand = members_of(ledger, book.groups_for(job))
    prio = job.cls.priority
    cards = {i: lower_cards(book, i, prio) for i in cand}  # shared cards of lower jobs only (note 042)
    lower = {i: book.lower_gpus(i, prio, False) + cards[i].bit_count() for i in cand}
    if not any(lower.values()):
        return False
    avail = {i: ledger.slots[i].free + lower[i] for i in cand}
    totals = {i: ledger.slots[i].healthy for i in cand}
    if place_counts(avail, cand, totals, job.shape) is None:
        return False
    if job.shape.island and book.on_islands(job):  # and inside one island (note 037)
        masks = {i: ledger.slots[i].free_mask | cards[i] for i in cand}
        for v in book.running.values():
            if v.state is JobState.RUNNING and v.cls.priority < prio:
                for idx, m in v.alloc:
                    if idx in masks:
                        masks[idx] |= m & ledger.slots[idx].healthy_mask
        if best_fit_island(avail, cand, job.shape.k, ledger.slots, masks) is None:
            return False
    return _leaves_reserved(book, job, job.units)


def _leaves_reserved(book, job: Job, units: int) -> bool:
    """Whether a run of ``units`` would leave other classes' ``reserved_gpus`` free once
    every lower-priority job is gone (reserved GPUs are not room; rule 8's count)."""
    if not book.reserved:
        return True
    held = sum(max(0, r - book.class_units.get(c, 0)) for c, r in book.reserved.items() if c != job.cls.name)
    if not held:
        return True
    ledger = book.ledger
    prio = job.cls.priority
    lower_total = sum(book.lower_gpus(i, prio, False) + lower_cards(book, i, prio).bit_count()
                      for i in range(len(ledger.slots)) if ledger.slots[i].alive)
    return (ledger.free_total + lower_total) * GPU_UNITS - units >= held


def lower_shares_would_make_room(book, job: Job) -> bool:
    """Whether evicting *every* lower-priority running share (evictable or not) on some
    card would make share ``job`` (not MIG) fit it: then its blocker is "no preemptible
    victims", not the card's room (note 042)."""
    if job.share.kind == "mig" or not any(q < job.cls.priority for q in book.running_prio):
        return False
    ledger = book.ledger
    prio = job.cls.priority
    for n in members_of(ledger, book.groups_for(job)):
        slot = ledger.slots[n]
        for g in sorted(slot.cards):
            if not slot.healthy_mask >> g & 1:
                continue
            lower = [v for v in (book.jobs[h] for h in slot.cards[g].holders)
                     if v.state is JobState.RUNNING and v.cls.priority < prio]
            gone = card_set(slot.cards[g], slot.node, job.share, lower) if lower else None
            # a set that empties the card opens it afresh: a whole GPU out of the free ones
            if gone is not None and (len(gone) < len(slot.cards[g].holders)
                                     or _leaves_reserved(book, job, GPU_UNITS)):
                return True
    return False


def unevictable_lower(book, job: Job) -> bool:
    """Whether some lower-priority job on a node ``job`` may use holds GPUs and may not be
    its victim for a reason other than its age: its class or the job not preemptible, it
    is stopping already, or a cohort keeps it (``preemption.candidates``' lenders; that
    reason names the cohort first, ``kept_by_cohort``, note 063) - what
    ``NoPreemptibleVictims(lower-priority jobs may not be preempted)`` claims. A job only
    younger than ``preemption.min_runtime_s`` does not count (that reason says when)."""
    nodes = book.nodes_for(job)
    prio = job.cls.priority
    may = None
    for x in book.running.values():
        if (x.state not in (JobState.RUNNING, JobState.STOPPING) or x.cls.priority >= prio
                or not any(i in nodes for i, _m in x.alloc)):
            continue
        if x.state is JobState.STOPPING or not x.evictable:
            return True
        if may is None:
            may = {v.id for v in candidates(book, job, False)}
        if x.id not in may and comes_of_age(book, x) <= book.now:
            return True  # kept by its cohort
    return False

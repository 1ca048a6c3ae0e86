"""Reservations and backfill (EASY backfill, Lifka 1995; Slurm's ``sched/backfill``).

The top blocked jobs get a *reservation*: the earliest time their GPUs are free if every
running job ends at its estimated end (its time limit, or a prediction; never its true
duration), and the GPUs per node they would take then. A later job may start now only
if it cannot delay any reservation: it ends (by its own estimate) before the
reservation's start, or it takes on each node no more than the reservation leaves
spare there. A job without an estimate ends "never" for this rule.

A preemptor whose victims are still inside their grace period holds a reservation that
starts now over the GPUs its victims free (no one else may take them: no eviction loops).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpushepherd.core.placement import Counts, members_of, place_counts
from gpushepherd.core.state import INF, Job

if TYPE_CHECKING:  # pragma: no cover
    from gpushepherd.core.scheduler import Scheduler


@dataclass(slots=True)
class Reservation:
    """A blocked job's planned start.

    Attributes:
        job_id: the job the GPUs are reserved for.
        start: earliest start, seconds (``now`` for a preemptor's hold).
        claims: ``{node index: GPUs}`` the job takes at ``start``.
        spare: ``{node index: GPUs}`` a job still running at ``start`` may take on a
            claimed node now without delaying the reservation.
        hold: a preemptor's hold on the GPUs its victims free.
    """

    job_id: str
    start: float
    claims: dict[int, int]
    spare: dict[int, int] = field(default_factory=dict)
    hold: bool = False


def reserve_for(sched: "Scheduler", job: Job, now: float, prior: list[Reservation]) -> Reservation | None:
    """The earliest start of ``job`` from the running jobs' estimated ends.

    Earlier reservations' claims are taken out of the availability from now on (a
    conservative profile). Returns ``None`` when no start can be planned (the GPUs
    needed are held by jobs without an estimate).
    """
    ledger = sched.ledger
    cand = members_of(ledger, sched.groups_for(job))
    avail = {i: ledger.slots[i].free for i in cand}
    totals = {i: ledger.slots[i].healthy for i in cand}
    for r in prior:
        for n, c in r.claims.items():
            if n in avail:
                avail[n] -= c
    shape = job.shape
    placed = place_counts(avail, cand, totals, shape)
    start = now
    if placed is None:
        total = sum(v for v in avail.values() if v > 0)
        ends = sched.ends_sorted()
        i, n_ends = 0, len(ends)
        while i < n_ends and placed is None:
            end_t = ends[i][0]
            if end_t == INF:
                break
            touched = False
            # release every job that ends at this instant before testing the fit
            while i < n_ends and ends[i][0] == end_t:
                victim = sched.jobs[ends[i][2]]
                i += 1
                for idx, mask in victim.alloc:
                    if idx in avail:
                        before = avail[idx]
                        avail[idx] = before + mask.bit_count()
                        total += max(avail[idx], 0) - max(before, 0)
                        touched = True
            if not touched or total < shape.k:
                continue
            placed = place_counts(avail, cand, totals, shape)
            if placed is not None:
                start = max(end_t, now)
    if placed is None:
        return None
    claims = dict(placed)
    spare = {n: avail[n] - c for n, c in claims.items()}
    return Reservation(job.id, start, claims, spare)


def hold_for_preemptor(sched: "Scheduler", job: Job, now: float) -> Reservation:
    """The reservation of a preemptor whose victims are still exiting."""
    ledger = sched.ledger
    claims = dict(job.plan)
    coming: dict[int, int] = {}
    for vid in job.victims:
        for idx, mask in sched.jobs[vid].alloc:
            coming[idx] = coming.get(idx, 0) + mask.bit_count()
    spare = {n: max(0, ledger.slots[n].free + coming.get(n, 0) - c) for n, c in claims.items()}
    return Reservation(job.id, now, claims, spare, hold=True)


def conflict(reservations: list[Reservation], counts: Counts, end: float) -> Reservation | None:
    """The first reservation a job placed on ``counts`` and ending at ``end`` would delay."""
    for r in reservations:
        if end <= r.start:
            continue
        spare = r.spare
        for n, c in counts:
            s = spare.get(n)
            if s is not None and s < c:
                return r
    return None


def place_around(sched: "Scheduler", job: Job, reservations: list[Reservation], end: float) -> Counts | None:
    """Place ``job`` on free GPUs without taking what reservations need (a job that
    ends after a reservation's start keeps within that reservation's spare GPUs)."""
    ledger = sched.ledger
    cand = members_of(ledger, sched.groups_for(job))
    avail = {i: ledger.slots[i].free for i in cand}
    for r in reservations:
        if end <= r.start:
            continue
        for n, s in r.spare.items():
            if n in avail and avail[n] > s:
                avail[n] = max(0, s)
    totals = {i: ledger.slots[i].healthy for i in cand}
    return place_counts(avail, cand, totals, job.shape)


def consume(reservations: list[Reservation], counts: Counts, end: float) -> None:
    """Charge a started job against the spare GPUs of the reservations it outlives."""
    for r in reservations:
        if end <= r.start:
            continue
        for n, c in counts:
            if n in r.spare:
                r.spare[n] -= c

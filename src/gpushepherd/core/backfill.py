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
        quota: ``{(limit index, user): amount}`` of each limit the job counts against
            that a job still running at ``start`` may still take (a backfilled job of
            the same team must not take the quota the reserved job needs).
    """

    job_id: str
    start: float
    claims: dict[int, int]
    spare: dict[int, int] = field(default_factory=dict)
    hold: bool = False
    quota: dict[tuple[int, str], int] = field(default_factory=dict)
    key: tuple = ()  # the reserved job's queue order key: only jobs behind it are held back


def reserve_for(sched: "Scheduler", job: Job, now: float, prior: list[Reservation]) -> Reservation | None:
    """The earliest start of ``job`` from the running jobs' estimated ends.

    Earlier reservations' claims are taken out of the availability from now on (a
    conservative profile). Jobs past their estimated end are taken to end now. Returns
    ``None`` when no start can be planned (the GPUs needed are held by jobs without an
    estimate). Only nodes whose availability changes during the walk are looked at; the
    exact placement runs when a cheap necessary condition says it may succeed.
    """
    ledger = sched.ledger
    slots = ledger.slots
    groups = sched.groups_for(job)
    nodeset = sched.nodes_for(job)
    shape = job.shape
    taken: dict[int, int] = {}
    for r in prior:
        for n, c in r.claims.items():
            if n in nodeset:
                taken[n] = taken.get(n, 0) + c
    gate = _Gate(shape, ledger, groups, nodeset, taken)
    changed: dict[int, int] = {}

    def full() -> dict[int, int]:
        avail = {i: slots[i].free - taken.get(i, 0) for i in nodeset}
        avail.update(changed)
        return avail

    placed = None
    start = now
    if gate.maybe():
        avail = full()
        placed = place_counts(avail, sorted(nodeset), {i: slots[i].healthy for i in nodeset}, shape)
    if placed is None:
        ends = sched.ends_sorted()
        i, n_ends = 0, len(ends)
        while i < n_ends and placed is None:
            end_t = ends[i][0]
            if end_t == INF:
                break
            touched = False
            # release every job that ends at this instant before testing the fit
            while i < n_ends and ends[i][0] == end_t:
                holder = sched.jobs[ends[i][2]]
                i += 1
                for idx, mask in holder.alloc:
                    if idx in nodeset:
                        before = changed.get(idx)
                        if before is None:
                            before = slots[idx].free - taken.get(idx, 0)
                        after = before + mask.bit_count()
                        changed[idx] = after
                        gate.update(before, after, slots[idx].healthy)
                        touched = True
            if touched and gate.maybe():
                avail = full()
                placed = place_counts(avail, sorted(nodeset), {i: slots[i].healthy for i in nodeset}, shape)
                if placed is not None:
                    start = max(end_t, now)
    if placed is None:
        return None
    claims = dict(placed)
    spare = {n: avail[n] - c for n, c in claims.items()}
    return Reservation(job.id, start, claims, spare, quota=quota_spare(sched, job, start), key=job.key)


class _Gate:
    """A cheap necessary condition for ``place_counts`` to succeed, kept up to date as
    GPUs are added during a reservation walk, so the exact placement runs only when it
    may succeed. Starts from the ledger's free-count buckets (no scan over nodes) unless
    earlier claims change the picture."""

    __slots__ = ("shape", "slots", "whole", "biggest", "top", "homog", "sum")

    def __init__(self, shape, ledger, groups: list[int], nodeset, taken: dict[int, int]):
        self.shape = shape
        sizes = {ledger.groups[g].gpus for g in groups}
        self.top = max(sizes, default=1)
        self.homog = len(sizes) <= 1 and all(
            ledger.groups[g].healthy_sum == len(ledger.groups[g].members) * ledger.groups[g].gpus for g in groups)
        if taken or not self.homog:
            vals = [(ledger.slots[i].free - taken.get(i, 0), ledger.slots[i].healthy) for i in nodeset]
            self.sum = sum(max(0, v) for v, _ in vals)
            self.biggest = max((v for v, _ in vals), default=0)
            self.whole = sum(1 for v, h in vals if v > 0 and v >= h)
            per = shape.per_pod
            self.slots = sum(max(0, v) // per for v, _ in vals)
        else:
            self.sum = ledger.free_in(groups)
            self.biggest = ledger.max_free_node(groups)
            self.whole = sum(len(ledger.groups[g].buckets[ledger.groups[g].gpus]) for g in groups)
            per = shape.per_pod
            self.slots = sum(len(b) * (f // per) for g in groups for f, b in enumerate(ledger.groups[g].buckets))

    def update(self, before: int, after: int, healthy: int) -> None:
        per = self.shape.per_pod
        self.slots += max(0, after) // per - max(0, before) // per
        if before < healthy <= after:
            self.whole += 1
        self.sum += max(0, after) - max(0, before)
        if after > self.biggest:
            self.biggest = after

    def maybe(self) -> bool:
        shape = self.shape
        if shape.mode == "single":
            return self.biggest >= shape.k
        if shape.mode == "pods":
            return self.slots >= shape.pods
        if not self.homog:  # mixed node sizes: only the total is a safe test
            return self.sum >= shape.k
        need_whole, rest = divmod(shape.k, self.top)
        return self.whole >= need_whole and (rest == 0 or self.biggest >= rest)


def quota_spare(sched: "Scheduler", job: Job, start: float) -> dict[tuple[int, str], int]:
    """Per limit the job counts against: what others may still take of it and hold
    past ``start`` without leaving the job short at ``start`` (jobs that end by then by
    their estimates give their share back)."""
    if not job.charges:
        return {}
    quota = sched.quota
    keys = {(i, user): amount for i, user, amount in job.charges}
    freed = dict.fromkeys(keys, 0)
    for end_t, _seq, job_id in sched.ends_sorted():
        if end_t > start:
            break
        for i, user, amount in sched.jobs[job_id].charges:
            if (i, user) in freed:
                freed[(i, user)] += amount
    return {key: max(0, quota.current[key[0]] - (quota.usage.get(key, 0) - freed[key]) - amount)
            for key, amount in keys.items()}


def hold_for_preemptor(sched: "Scheduler", job: Job, now: float) -> Reservation:
    """The reservation of a preemptor whose victims are still exiting."""
    ledger = sched.ledger
    claims = dict(job.plan)
    coming: dict[int, int] = {}
    for vid in job.victims:
        for idx, mask in sched.jobs[vid].alloc:
            coming[idx] = coming.get(idx, 0) + mask.bit_count()
    spare = {n: max(0, ledger.slots[n].free + coming.get(n, 0) - c) for n, c in claims.items()}
    # a victim may queue ahead of its preemptor - a reclaimed borrower of the same
    # class, or any victim when priority weights other than class order the queue -
    # so the hold binds every job, or the requeued victim would take the GPUs back at
    # once (an eviction loop)
    pr = sched.rules.priority
    by_class_alone = not (pr.dynamic or pr.size_weight or pr.time_limit_weight)
    key = (-INF,) if job.reclaim or not by_class_alone else job.key
    return Reservation(job.id, now, claims, spare, hold=True, quota=quota_spare(sched, job, now), key=key)


def conflict(reservations: list[Reservation], counts: Counts, end: float, key: tuple) -> Reservation | None:
    """The first reservation a job (queue order ``key``) placed on ``counts`` and
    ending at ``end`` would delay by taking its GPUs. Reservations of jobs queued
    behind it do not hold it back."""
    for r in reservations:
        if end <= r.start or key < r.key:
            continue
        spare = r.spare
        for n, c in counts:
            s = spare.get(n)
            if s is not None and s < c:
                return r
    return None


def quota_conflict(reservations: list[Reservation], charges: tuple, end: float, key: tuple) -> Reservation | None:
    """The first reservation a job with ``charges`` ending at ``end`` would delay by
    taking quota the reserved job needs at its start (as ``conflict``)."""
    if not charges:
        return None
    for r in reservations:
        if end <= r.start or not r.quota or key < r.key:
            continue
        for i, user, amount in charges:
            s = r.quota.get((i, user))
            if s is not None and s < amount:
                return r
    return None


def place_around(sched: "Scheduler", job: Job, reservations: list[Reservation], end: float) -> Counts | None:
    """Place ``job`` on free GPUs without taking what reservations need (a job that
    ends after a reservation's start keeps within that reservation's spare GPUs)."""
    ledger = sched.ledger
    cand = members_of(ledger, sched.groups_for(job))
    avail = {i: ledger.slots[i].free for i in cand}
    for r in reservations:
        if end <= r.start or job.key < r.key:
            continue
        for n, s in r.spare.items():
            if n in avail and avail[n] > s:
                avail[n] = max(0, s)
    totals = {i: ledger.slots[i].healthy for i in cand}
    return place_counts(avail, cand, totals, job.shape)


def consume(reservations: list[Reservation], counts: Counts, end: float, charges: tuple, key: tuple) -> None:
    """Charge a started job against the spare GPUs and quota of the reservations it
    outlives (those of jobs ahead of it)."""
    for r in reservations:
        if end <= r.start or key < r.key:
            continue
        for n, c in counts:
            if n in r.spare:
                r.spare[n] -= c
        if r.quota:
            for i, user, amount in charges:
                if (i, user) in r.quota:
                    r.quota[(i, user)] -= amount

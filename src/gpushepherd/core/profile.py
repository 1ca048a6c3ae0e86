"""The time profile of one pass: holds, reservations, and what they leave to others
(Slurm's backfill map; design note 015, section 2).

* A running job's GPUs come free at its *planned end*: ``start + min(estimate, limit +
  the grace its time-limit stop gets)``; a signalled job's at the end of its grace; a
  job past its planned end is taken to end now (``Book.ends``).
* A **hold** protects what a preemptor will get: on each node it needs
  ``max(0, claimed - what its victims there free)`` of the GPUs free now, and the same of
  the quota headroom - against every job but itself.
* A **reservation** claims GPUs per node and quota over ``[start, start + planned run)``.
  Its start is the earliest instant at which its job fits for its whole planned run,
  given earlier claims (deep reservations: each claim counts only over its interval).
* A job may start now on ``x`` GPUs of node ``n`` if ``x`` is within what holds leave
  free there, and within the *spare* of every claim point (a reservation's start) before
  its own planned end: ``spare(p, n) = GPUs free at p - claims active at p - jobs started
  in this pass still running at p`` (and the same for quota).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpushepherd.core.placement import Counts, place_counts
from gpushepherd.core.state import INF, Job
from gpushepherd.model.job import GPU_UNITS, JobState

Key = tuple[int, str]  # (limit index, user or "")


@dataclass(slots=True)
class Claim:
    """A hold or a reservation.

    Attributes:
        job_id: the job the GPUs are for.
        hold: a preemptor's hold (else a reservation).
        start / end: the claimed interval, seconds (a hold: now .. its planned end).
        gpus: ``{node index: GPUs}`` claimed.
        need_now: a hold's ``{node index: GPUs}`` needed from those free now.
        quota: ``{(limit, user): amount}`` claimed.
        quota_now: a hold's quota needed from the headroom now.
        key: the job's queue order key.
        basis: what the start rests on: ``estimates`` or ``time limits`` (note 015, 7).
    """

    job_id: str
    hold: bool
    start: float
    end: float
    gpus: dict[int, int]
    need_now: dict[int, int] = field(default_factory=dict)
    quota: dict[Key, int] = field(default_factory=dict)
    quota_now: dict[Key, int] = field(default_factory=dict)
    key: tuple = ()
    basis: str = "estimates"


class Profile:
    """The claims in force during one pass and the spare they leave, kept up to date as
    jobs start. ``book`` is read, never changed."""

    def __init__(self, book):
        self.book = book
        self.claims: list[Claim] = []
        self.held_now: dict[int, list[tuple[Claim, int]]] = {}  # node -> [(hold, GPUs)]
        self.quota_held: dict[Key, list[tuple[Claim, int]]] = {}
        self.points: list[float] = []  # reservation starts, ascending
        self.spare: dict[float, dict[int, int]] = {}  # point -> node -> spare GPUs
        self.qspare: dict[float, dict[Key, int]] = {}  # point -> (limit, user) -> spare
        self.owners: dict[float, list[Claim]] = {}  # point -> reservations active there

    def __bool__(self) -> bool:
        return bool(self.claims)

    # ------------------------------------------------------------- building
    def add_hold(self, job: Job) -> Claim:
        """The hold of a preemptor: its plan's GPUs, those its victims free counted."""
        book = self.book
        coming: dict[int, int] = {}
        qcoming: dict[Key, int] = {}
        exit_t = book.now
        for vid in sorted(job.victims):
            v = book.jobs[vid]
            exit_t = max(exit_t, v.end_est)
            for idx, mask in v.alloc:
                coming[idx] = coming.get(idx, 0) + (mask & book.ledger.slots[idx].healthy_mask).bit_count()
            for i, user, amount in v.run_charges:
                qcoming[(i, user)] = qcoming.get((i, user), 0) + amount
        gpus = dict(job.plan)
        charges = book.charges_with(job, job.units, book.coverage_for(job, job.units))
        quota = {(i, user): amount for i, user, amount in charges}
        claim = Claim(job.id, True, book.now, exit_t + job.planned_run(), gpus,
                      {n: max(0, c - coming.get(n, 0)) for n, c in gpus.items()}, quota,
                      {k: max(0, a - qcoming.get(k, 0)) for k, a in quota.items()}, job.key)
        self.claims.append(claim)
        for n, c in claim.need_now.items():
            if c:
                self.held_now.setdefault(n, []).append((claim, c))
        for k, a in claim.quota_now.items():
            if a:
                self.quota_held.setdefault(k, []).append((claim, a))
        return claim

    def add_reservation(self, job: Job, start: float, counts: Counts, basis: str) -> Claim:
        """Claim ``counts`` and the job's quota over ``[start, start + planned run)``."""
        book = self.book
        end = start + job.planned_run()
        quota = {(i, user): amount for i, user, amount in job.charges}
        claim = Claim(job.id, False, start, end, dict(counts), quota=quota, key=job.key, basis=basis)
        # the claim takes its GPUs and quota from every point it covers
        for p in self.points:
            if start <= p < end:
                sp = self.spare[p]
                for n, c in counts:
                    sp[n] = sp.get(n, self._spare_fresh(n, p)) - c
                qs = self.qspare[p]
                for k, a in quota.items():
                    qs[k] = qs.get(k, self._qspare_fresh(k, p)) - a
                self.owners[p].append(claim)
        self.claims.append(claim)
        if start not in self.spare:
            self._add_point(start)
        return claim

    def _add_point(self, p: float) -> None:
        """A new claim point: the spare of every node and quota key that a claim active
        at ``p`` touches, computed from the book and those claims."""
        active = [c for c in self.claims if not c.hold and c.start <= p < c.end]
        nodes = {n for c in active for n in c.gpus}
        keys = {k for c in active for k in c.quota}
        self.spare[p] = {n: self._spare_fresh(n, p) - sum(c.gpus.get(n, 0) for c in active) for n in sorted(nodes)}
        self.qspare[p] = {k: self._qspare_fresh(k, p) - sum(c.quota.get(k, 0) for c in active) for k in sorted(keys)}
        self.owners[p] = active
        i = 0
        while i < len(self.points) and self.points[i] < p:
            i += 1
        self.points.insert(i, p)

    def _spare_fresh(self, n: int, p: float) -> int:
        """GPUs of node ``n`` free at ``p`` by planned ends, before any reservation."""
        return gpus_free_at(self.book, n, p)

    def _qspare_fresh(self, k: Key, p: float) -> int:
        """Headroom of limit ``k`` at ``p``: its value now minus the usage of the jobs
        still running at ``p`` by their planned ends."""
        book = self.book
        i, user = k
        used = book.quota.usage.get(k, 0)
        for end, _seq, jid in book.ends:
            if end > p:
                break
            for li, u, a in book.jobs[jid].run_charges:
                if li == i and u == user:
                    used -= a
        return book.quota.current[i] - used

    # ------------------------------------------------------------- queries
    def binding_points(self, end: float) -> list[float]:
        """Claim points a run ending at ``end`` (now onwards) covers."""
        pts = self.points
        if not pts or pts[0] >= end:
            return []
        return [p for p in pts if p < end]

    def node_cap(self, job_id: str, n: int, free: int, end: float) -> int:
        """The most GPUs of node ``n`` (``free`` of them free now) a job may take now for
        a run ending at ``end`` without delaying a claim."""
        cap = free
        held = self.held_now.get(n)
        if held:
            cap -= sum(c for claim, c in held if claim.job_id != job_id)
        for p in self.binding_points(end):
            s = self.spare[p].get(n)
            if s is not None and s < cap:
                cap = s
        return max(0, cap)

    def quota_cap(self, job_id: str, k: Key, headroom: int, end: float) -> int:
        """The most of limit key ``k`` (``headroom`` left of it now) a job may take now
        for a run ending at ``end`` without delaying a claim."""
        cap = headroom
        held = self.quota_held.get(k)
        if held:
            cap -= sum(a for claim, a in held if claim.job_id != job_id)
        for p in self.binding_points(end):
            s = self.qspare[p].get(k)
            if s is not None and s < cap:
                cap = s
        return cap

    def blocker(self, job_id: str, counts: Counts, charges, end: float, free_of, headroom_of) -> Claim | None:
        """The first claim (holds first, then reservations in order) that a job placed
        on ``counts`` with ``charges``, ending at ``end``, would delay; ``None``."""
        for claim in self.claims:
            if claim.job_id == job_id:
                continue
            if claim.hold:
                for n, x in counts:
                    need = claim.need_now.get(n, 0)
                    if need and x > free_of(n) - need:
                        return claim
                for i, user, a in charges:
                    need = claim.quota_now.get((i, user), 0)
                    if need and a > headroom_of((i, user)) - need:
                        return claim
                continue
            if end <= claim.start:
                continue
            sp = self.spare.get(claim.start, {})
            for n, x in counts:
                s = sp.get(n)
                if s is not None and x > s and n in claim.gpus:
                    return claim
            qs = self.qspare.get(claim.start, {})
            for i, user, a in charges:
                s = qs.get((i, user))
                if s is not None and a > s and (i, user) in claim.quota:
                    return claim
        for p in self.binding_points(end):  # only the sum of several claims binds
            for n, x in counts:
                s = self.spare[p].get(n)
                if s is not None and x > s:
                    return next(c for c in self.owners[p] if n in c.gpus)
        return None

    # ------------------------------------------------------------- changes
    def consume(self, counts: Counts, end: float, charges) -> None:
        """A job started now on ``counts`` with ``charges``, planned to end at ``end``:
        it takes from the spare of every claim point it outlives."""
        for p in self.binding_points(end):
            sp = self.spare[p]
            for n, x in counts:
                if n in sp:
                    sp[n] -= x
            qs = self.qspare[p]
            for i, user, a in charges:
                if (i, user) in qs:
                    qs[(i, user)] -= a

    def drop_hold(self, job_id: str) -> None:
        """Forget a preemptor's hold (it started, or its victims left and it does not fit)."""
        for claim in [c for c in self.claims if c.hold and c.job_id == job_id]:
            self.claims.remove(claim)
            for table in (self.held_now, self.quota_held):
                for k in list(table):
                    table[k] = [(c, a) for c, a in table[k] if c is not claim]
                    if not table[k]:
                        del table[k]

    def reservation_of(self, job_id: str) -> Claim | None:
        for claim in self.claims:
            if claim.job_id == job_id:
                return claim
        return None


def release_time(book, n: int, g: int) -> float:
    """When whole GPU ``g`` of node ``n`` is planned to be free (``INF``: not in service,
    a MIG GPU, or held by a job without an end)."""
    slot = book.ledger.slots[n]
    if not slot.alive or not slot.healthy_mask >> g & 1:
        return INF
    h = slot.holder[g]
    if h is None:
        return book.now
    card = slot.cards.get(g)
    if card is not None:
        t = max((book.jobs[j].end_est for j in card.holders), default=book.now)
    elif h in book.jobs:
        t = book.jobs[h].end_est
    else:
        return INF
    return max(t, book.now)


def gpus_free_at(book, n: int, p: float) -> int:
    """Whole GPUs of node ``n`` free at ``p`` by planned ends (no claims)."""
    slot = book.ledger.slots[n]
    if not slot.alive:
        return 0
    if p <= book.now:
        return slot.free
    return sum(1 for g in range(slot.total) if release_time(book, n, g) <= p)


def basis_of(book, jobs) -> str:
    """``estimates`` when every planned end among ``jobs`` comes from a runtime estimate
    shorter than the job's time limit, else ``time limits``."""
    for job in jobs:
        if job.state is JobState.RUNNING:
            est = job.remaining_estimate()
            lim = job.run_limit()
            if lim is not None and (est is None or est >= lim):
                return "time limits"
    return "estimates"


def earliest_start(book, profile: Profile, job: Job, nodes: list[int], totals: dict[int, int],
                   check_quota: bool = True) -> tuple[float, Counts] | None:
    """The earliest instant (>= now) at which ``job`` fits ``nodes`` for its whole planned
    run, given running jobs' planned ends and the profile's claims, with its quota
    (``check_quota``); ``(start, counts)`` or ``None`` when no instant can be planned.

    Candidate instants are now, each planned end on the nodes and each claim's end (free
    GPUs only grow between them). At an instant ``t`` a node offers the least it has free
    over ``[t, t + planned run)``: that is at ``t`` or at a claim's start inside. Without
    claims on the nodes the walk is incremental: only nodes whose GPUs come free are
    looked at, and the exact placement runs when a cheap necessary condition holds."""
    now = book.now
    run = job.planned_run()
    node_set = set(nodes)
    gclaims = [c for c in profile.claims if not node_set.isdisjoint(c.gpus)]
    qkeys = {(i, user) for i, user, _a in job.charges} if check_quota else set()
    qclaims = list(profile.claims)
    if gclaims:
        found = _walk_claims(book, job, nodes, totals, gclaims, run)
    else:
        found = _walk_free(book, job, nodes, totals)
    if found is None or not (qkeys or _holds_for_others(book, job)):
        return found
    t, counts = found
    t_q = _quota_start(book, job, qclaims, t, run)
    if t_q is None:
        return None
    if t_q == t:
        return found
    if gclaims:  # availability is not monotone under claims: place again from there
        later = _walk_claims(book, job, nodes, totals, gclaims, run, t_min=t_q)
        if later is None:
            return None
        if later[0] == t_q:
            return later
        return earliest_start_from(book, profile, job, nodes, totals, later[0])
    return t_q, _place_at(book, job, nodes, totals, t_q)


def earliest_start_from(book, profile, job, nodes, totals, t_min: float):
    """``earliest_start`` no earlier than ``t_min`` (GPUs and quota alternately, until
    both hold at one instant)."""
    run = job.planned_run()
    node_set = set(nodes)
    gclaims = [c for c in profile.claims if not node_set.isdisjoint(c.gpus)]
    qclaims = list(profile.claims)
    for _ in range(64):
        found = _walk_claims(book, job, nodes, totals, gclaims, run, t_min=t_min)
        if found is None:
            return None
        t_q = _quota_start(book, job, qclaims, found[0], run)
        if t_q is None:
            return None
        if t_q == found[0]:
            return found
        t_min = t_q
    return None  # pragma: no cover - claims alternate more than 64 times


def _place_at(book, job: Job, nodes: list[int], totals: dict[int, int], t: float) -> Counts | None:
    avail = {n: gpus_free_at(book, n, t) for n in nodes}
    return place_counts(avail, nodes, totals, job.shape)


def _walk_free(book, job: Job, nodes: list[int], totals: dict[int, int]) -> tuple[float, Counts] | None:
    """The earliest instant by planned ends alone (no claims on these nodes): the walk
    over planned ends touches only the nodes whose GPUs come free, and runs the exact
    placement when a cheap necessary condition (``_Gate``) holds."""
    ledger = book.ledger
    slots = ledger.slots
    node_set = set(nodes)
    changed: dict[int, int] = {}

    def full() -> dict[int, int]:
        avail = {n: slots[n].free for n in nodes}
        avail.update(changed)
        return avail

    shape = job.shape
    single = shape.mode == "single" and len(nodes) == len(book.nodes_for(job))
    gate = _Gate.of(shape, ledger, book.groups_for(job), nodes, totals)
    if gate.maybe():
        if single:
            idx = ledger.best_fit(book.groups_for(job), shape.k)
            if idx is not None:
                return book.now, [(idx, shape.k)]
        else:
            counts = place_counts(full(), nodes, totals, shape)
            if counts is not None:
                return book.now, counts
    k = shape.k
    ends = book.ends
    i, n_ends = 0, len(ends)
    while i < n_ends:
        end_t = ends[i][0]
        if end_t == INF:
            return None
        touched = False
        while i < n_ends and ends[i][0] == end_t:  # every job that ends at this instant
            holder = book.jobs[ends[i][2]]
            i += 1
            for idx, mask in holder.alloc:
                if idx in node_set:
                    got = _freed_whole(book, holder, idx, mask, end_t)
                    if got:
                        before = changed.get(idx, slots[idx].free)
                        gate.update(before, before + got, totals[idx])
                        changed[idx] = before + got
                        touched = True
        if touched and gate.maybe():
            if single:
                # no node had k free before (else found above): the best fit is among
                # the nodes whose GPUs came free
                best = min(((f, n) for n, f in changed.items() if f >= k), default=None)
                if best is not None:
                    return max(end_t, book.now), [(best[1], k)]
                continue
            counts = place_counts(full(), nodes, totals, shape)
            if counts is not None:
                return max(end_t, book.now), counts
    return None


def _freed_whole(book, holder: Job, idx: int, mask: int, t: float) -> int:
    """Whole GPUs of node ``idx`` that ``holder`` leaving at ``t`` frees: its own GPUs in
    service, or for a share the card once its last holder is planned to leave."""
    slot = book.ledger.slots[idx]
    if mask:
        return (mask & slot.healthy_mask).bit_count()
    if len(holder.share_at) == 1:
        g = holder.share_at[0]
        if slot.healthy_mask >> g & 1 and release_time(book, idx, g) <= max(t, book.now):
            card = slot.cards.get(g)
            last = max(card.holders, key=lambda j: (book.jobs[j].end_est, book.jobs[j].seq)) if card else None
            return 1 if last == holder.id else 0
    return 0


def _walk_claims(book, job: Job, nodes: list[int], totals: dict[int, int], claims: list[Claim], run: float,
                 t_min: float | None = None) -> tuple[float, Counts] | None:
    """The earliest instant with claims on the nodes: every candidate instant checked."""
    now = book.now
    releases = {n: sorted(release_time(book, n, g) for g in range(book.ledger.slots[n].total)) for n in nodes}
    times = {now}
    for rel in releases.values():
        times.update(t for t in rel if t != INF)
    times.update(c.end for c in claims if c.end != INF)
    lo = now if t_min is None else max(now, t_min)
    times.add(lo)
    for t in sorted(times):
        if t < lo:
            continue
        end = t + run
        probes = [t] + [c.start for c in claims if t < c.start < end]
        avail = {}
        for n in nodes:
            rel = releases[n]
            least = None
            for q in probes:
                free = _count_le(rel, q) - sum(c.gpus.get(n, 0) for c in claims if c.start <= q < c.end)
                least = free if least is None else min(least, free)
            avail[n] = max(0, least)
        counts = place_counts(avail, nodes, totals, job.shape)
        if counts is not None:
            return t, counts
    return None


def _count_le(sorted_times: list[float], q: float) -> int:
    n = 0
    for t in sorted_times:
        if t > q:
            break
        n += 1
    return n


def _holds_for_others(book, job: Job) -> bool:
    return bool(book.reserved) and any(c != job.cls.name for c in book.reserved) and job.shape.mode != "share"


def _quota_start(book, job: Job, claims: list[Claim], t0: float, run: float) -> float | None:
    """The earliest instant >= ``t0`` from which the job's counted constraints hold for
    its planned run: its quota (usage by planned ends, plus claims active, plus its own
    charges, within each limit's value now) and other classes' ``reserved_gpus`` (the
    GPUs free then, less the claims, leave them free). ``None`` when never."""
    quota = book.quota
    keys = {(i, user): a for i, user, a in job.charges}
    hold = _holds_for_others(book, job)
    times = {t0}
    times.update(e for e, _s, _j in book.ends if e > t0 and e != INF)
    times.update(c.end for c in claims if c.end > t0 and c.end != INF)
    for t in sorted(times):
        end = t + run
        probes = [t] + [c.start for c in claims if t < c.start < end]
        ok = True
        for q in probes:
            for k, a in keys.items():
                used = quota.usage.get(k, 0) - _released_by(book, k, q)
                extra = sum(c.quota.get(k, 0) for c in claims if c.start <= q < c.end)
                if used + extra + a > quota.current[k[0]]:
                    ok = False
                    break
            if ok and hold and not _class_hold_ok(book, job, q, claims):
                ok = False
            if not ok:
                break
        if ok:
            return t
    return None


def _class_hold_ok(book, job: Job, q: float, claims: list[Claim]) -> bool:
    """Whether at ``q`` (by planned ends) the free GPUs, less the claims active then and
    the job's own, still cover what other classes' ``reserved_gpus`` keep free."""
    free = book.ledger.free_total
    used = dict(book.class_units)
    for e, _seq, jid in book.ends:
        if e > q:
            break
        holder = book.jobs[jid]
        for idx, mask in holder.alloc:
            free += (mask & book.ledger.slots[idx].healthy_mask).bit_count()
        used[holder.cls.name] = used.get(holder.cls.name, 0) - holder.run_units
    free -= sum(sum(c.gpus.values()) for c in claims if c.start <= q < c.end)
    held = sum(max(0, r - used.get(c, 0)) for c, r in book.reserved.items() if c != job.cls.name)
    return free * GPU_UNITS - job.units >= held


def _released_by(book, k: Key, q: float) -> int:
    i, user = k
    out = 0
    for e, _seq, jid in book.ends:
        if e > q:
            break
        for li, u, a in book.jobs[jid].run_charges:
            if li == i and u == user:
                out += a
    return out


class _Gate:
    """A cheap necessary condition for ``place_counts`` to succeed, kept up to date as
    GPUs come free during a walk, so the exact placement runs only when it may."""

    __slots__ = ("shape", "whole", "biggest", "top", "homog", "sum", "slots")

    @classmethod
    def of(cls, shape, ledger, groups: list[int], nodes: list[int], totals: dict[int, int]) -> "_Gate":
        """The gate from the ledger's free-count buckets when the job's groups are of one
        size and fully healthy (no walk over the nodes; the buckets may count nodes the job
        avoids, which only weakens a necessary condition), else from the nodes."""
        sizes = {ledger.groups[g].gpus for g in groups}
        if len(sizes) == 1 and all(ledger.groups[g].healthy_sum == len(ledger.groups[g].members) * ledger.groups[g].gpus
                                   for g in groups):
            gate = cls.__new__(cls)
            gate.shape = shape
            gate.top = sizes.pop()
            gate.homog = True
            gate.sum = ledger.free_in(groups)
            gate.biggest = ledger.max_free_node(groups)
            gate.whole = sum(len(ledger.groups[g].buckets[ledger.groups[g].gpus]) for g in groups)
            per = shape.per_pod
            gate.slots = sum(len(b) * (f // per) for g in groups for f, b in enumerate(ledger.groups[g].buckets))
            return gate
        return cls(shape, {n: ledger.slots[n].free for n in nodes}, totals)

    def __init__(self, shape, avail: dict[int, int], totals: dict[int, int]):
        self.shape = shape
        sizes = set(totals.values())
        self.top = max(sizes, default=1)
        self.homog = len(sizes) <= 1
        self.sum = sum(max(0, v) for v in avail.values())
        self.biggest = max(avail.values(), default=0)
        self.whole = sum(1 for n, v in avail.items() if v > 0 and v >= totals[n])
        per = shape.per_pod
        self.slots = sum(max(0, v) // per for v in avail.values())

    def update(self, before: int, after: int, healthy: int) -> None:
        if before < 0:
            before = 0
        if after < 0:
            after = 0
        per = self.shape.per_pod
        self.slots += after // per - before // per
        if before < healthy <= after:
            self.whole += 1
        self.sum += after - before
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

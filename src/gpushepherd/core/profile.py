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

from gpushepherd.core import pins
from gpushepherd.core.freed import card_of, freed_count, freed_parts, quota_freed, reserved_at_exit
from gpushepherd.core.ledger import bits
from gpushepherd.core.placement import Counts
from gpushepherd.core.releases import free_total_at, gpus_free_at
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
    cls: str = ""  # the job's class
    covered: int = 0  # a hold: what of its class's reserved_gpus its plan counted on
    lend: bool = False  # a reservation of a job its own team's hard limit keeps waiting now
    #: with classes' ``reserved_gpus``: the whole GPUs others may still take from the free
    #: ones at its start without breaking its class-hold condition (``class_slack``)
    gslack: int | None = None
    #: per reserved class, the part of its reservation the slack counted as not yet held
    #: (units; their sum is what it kept for other classes): a job of such a class takes
    #: that part from the reservation first, not from the slack (``takes``)
    gunfilled: dict[str, int] = field(default_factory=dict)
    #: a hold: when its victims are planned to be gone, per node (``exits``) and all
    #: (``exit``); before, it takes only ``need_now`` / ``quota_now`` (``gpus_at``)
    exits: dict[int, float] = field(default_factory=dict)
    exit: float = -INF
    #: a hold: the shared cards ``(node index, GPU)`` its victims hold - no other share
    #: joins them while the hold stands (what they free is the preemptor's; note 042); of
    #: a whole-GPU preemptor those they free whole on its plan's nodes (seed 157735), or
    #: anywhere with ``reserved_gpus`` (its class-hold slack counts them; seed 211517)
    cards: frozenset = frozenset()

    def gpus_at(self, n: int, q: float) -> int:
        """GPUs of node ``n`` the claim takes at ``q``: a hold takes those free now it
        needs until its victims there are gone (they hold the rest till then), then all."""
        if self.hold and q < self.exits.get(n, -INF):
            return self.need_now.get(n, 0)
        return self.gpus.get(n, 0)

    def total_at(self, q: float) -> int:
        """Whole GPUs the claim takes at ``q`` (``gpus_at`` over its nodes)."""
        return sum(self.gpus_at(n, q) for n in self.gpus)

    def quota_at(self, k: Key, q: float) -> int:
        """What of limit ``k`` the claim takes at ``q`` (a hold: ``quota_now`` until its
        victims are gone, their charges till then)."""
        if self.hold and q < self.exit:
            return self.quota_now.get(k, 0)
        return self.quota.get(k, 0)


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
        self._touched: dict[int, set[int]] = {}  # binding points -> nodes their claims touch
        #: the latest planned end of a job ``consume``d (``INF``: a share; ``standing.py``)
        self.consumed_until = -INF
        self.had_holds = False  # a hold was ever added (``standing.py``)

    def __bool__(self) -> bool:
        return bool(self.claims)

    # ------------------------------------------------------------- building
    def add_hold(self, job: Job) -> Claim:
        """The hold of a preemptor: its plan's GPUs, those its victims free counted."""
        book = self.book
        self.had_holds = True
        coming: dict[int, int] = {}
        qcoming: dict[Key, int] = {}
        exits: dict[int, float] = {}
        exit_t = book.now
        victims = [book.jobs[vid] for vid in sorted(job.victims)]
        whole = set()  # (node, GPU) its victims free whole
        for idx, m, _end in freed_parts(book.ledger, victims):  # shared cards too (note 042)
            coming[idx] = coming.get(idx, 0) + m.bit_count()
            whole.update((idx, g) for g in range(m.bit_length()) if m >> g & 1)
        for v in victims:
            exit_t = max(exit_t, v.end_est)
            for idx, _mask in v.alloc:
                exits[idx] = max(exits.get(idx, book.now), v.end_est)
            for i, user, amount in v.run_charges:
                qcoming[(i, user)] = qcoming.get((i, user), 0) + amount
        gpus = dict(job.plan)
        covered = 0
        res = book.reserved.get(job.cls.name)
        if res:  # what its class's reservation still covers after the holds before it
            taken = sum(c.covered for c in self.claims if c.hold and c.cls == job.cls.name)
            covered = max(0, min(job.units, res - book.covered_units.get(job.cls.name, 0) - taken))
        charges = book.charges_with(job, job.units, covered)
        quota = {(i, user): amount for i, user, amount in charges}
        # a card another preemptor, a share, plans to join: never this hold's (seed 515380)
        joined = set() if job.share is not None else {
            (n, g) for p in book.preemptors.values() if p is not job and p.share is not None
            for n, m in p.hold_gpus.items() for g in bits(m)}
        claim = Claim(job.id, True, book.now, exit_t + job.planned_run(), gpus,
                      {n: max(0, c - coming.get(n, 0), pins.free_pinned(book, job, n)) for n, c in gpus.items()}, quota,
                      {k: max(0, a - qcoming.get(k, 0)) for k, a in quota.items()}, job.key,
                      cls=job.cls.name, covered=covered, exits=exits, exit=exit_t,
                      cards=frozenset(c for c in map(card_of, victims) if c is not None and (
                          job.share is not None or (c in whole and c not in joined
                                                    and (c[0] in gpus or book.reserved)))))
        self.claims.append(claim)
        self._touched.clear()
        for n, c in claim.need_now.items():
            if c:
                self.held_now.setdefault(n, []).append((claim, c))
        if book.reserved:
            self._hold_slacks()
        for k, a in claim.quota_now.items():
            if a:
                self.quota_held.setdefault(k, []).append((claim, a))
        return claim

    def add_reservation(self, job: Job, start: float, counts: Counts, basis: str,
                        free_at: dict[int, int] | None = None, lend: bool = False) -> Claim:
        """Claim ``counts`` and the job's quota over ``[start, start + planned run)``.
        ``free_at``: the GPUs free at ``start`` on the claimed nodes when the walk that
        found the start knows them (saves looking them up again)."""
        book = self.book
        end = start + job.planned_run()
        quota = {(i, user): amount for i, user, amount in job.charges}
        claim = Claim(job.id, False, start, end, dict(counts), quota=quota, key=job.key, basis=basis,
                      cls=job.cls.name, lend=lend)
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
        self._touched.clear()
        if start not in self.spare:
            self._add_point(start, free_at)
        if book.reserved:
            taken = sum(counts_c for _n, counts_c in counts)
            for c in self.claims:
                if not c.hold and c is not claim and c.gslack is not None and start <= c.start < end:
                    c.gslack -= taken
            claim.gslack = class_slack(book, job.cls.name, start, self.claims, claim)
        return claim

    def _hold_slacks(self) -> None:
        """Each hold's slack: free GPUs now, plus what every hold's victims free, less what
        every hold takes, less what other classes' reservations keep free for its class."""
        book = self.book
        holds = [c for c in self.claims if c.hold]
        victims = {c.job_id: [book.jobs[v] for v in sorted(book.jobs[c.job_id].victims)] for c in holds}
        freed = {c.job_id: freed_count(book.ledger, victims[c.job_id]) for c in holds}
        coming = sum(freed.values())
        taken = sum(sum(c.gpus.values()) for c in holds)
        # a hold starts once its victims are gone: their class's reservation no longer
        # counts what they covered
        gone = frozenset(vid for c in holds for vid in book.jobs[c.job_id].victims)
        for c in holds:
            c.gunfilled = {}
            held = held_for(book, c.cls, book.now, (), gone, c.gunfilled)
            c.gslack = book.ledger.free_total + coming - taken - -(-held // GPU_UNITS)
            # and at its victims' exit, as its plan read it (note 090): reserved classes'
            # jobs planned to end by then cover nothing there
            mine = victims[c.job_id]
            late = mine and reserved_at_exit(book, mine, freed[c.job_id], max(v.end_est for v in mine))
            if late:
                held = held_for(book, c.cls, book.now, (), gone | late[2])
                c.gslack = min(c.gslack, book.ledger.free_total + coming + late[1] - taken - -(-held // GPU_UNITS))

    def avoiding(self, job: Job, end: float, exempt: tuple = ()) -> tuple[frozenset[int], Claim | None]:
        """The nodes of claims whose job ``job``'s class avoids (``avoid_nodes_with``,
        symmetric) and that start before a run of it ending at ``end`` would: there it
        would keep their job off its claimed node. Also the first such claim."""
        avoid = job.cls.avoid
        nodes: set[int] = set()
        first = None
        for c in self.claims:
            if c.cls in avoid and c.job_id != job.id and c not in exempt and (c.hold or c.start < end):
                nodes.update(n for n, k in c.gpus.items() if k)
                first = first or c
        return frozenset(nodes), first

    def class_blocker(self, job: Job, x: int, end: float, exempt: tuple = ()) -> Claim | None:
        """The first claim whose class-hold condition a job taking ``x`` whole GPUs now for
        a run ending at ``end`` would break (``takes``)."""
        if not self.book.reserved:
            return None
        own = next((c for c in self.claims if c.hold and c.job_id == job.id), None)
        for c in self.claims:
            if c.gslack is None or c.job_id == job.id or c in exempt:
                continue
            if (c.hold or c.start < end) and self.takes(c, job, x - self._counted(own, c))[0] > c.gslack:
                return c
        return None

    def _counted(self, own: Claim | None, c: Claim) -> int:
        """What a preemptor's own hold ``own`` already took from claim ``c``'s class-hold
        slack: its start gives that back, so only the rest of its GPUs count against the
        slack (seed 12010: a batch preemptor starting on its plan, once its victims were
        gone, was refused by a production-inference preemptor's hold whose slack had
        counted the plan's GPUs taken, and lost its GPUs)."""
        if own is None:
            return 0
        if not c.hold:
            return own.total_at(c.start)
        book = self.book
        return sum(own.gpus.values()) - _coming(book, own.job_id)

    def takes(self, c: Claim, job: Job, x: int) -> tuple[int, int]:
        """``(GPUs, units)``: what ``job`` taking ``x`` whole GPUs takes from claim ``c``'s
        class-hold slack, and from the reservations it counted. A job of another reserved
        class fills its class's reservation first: what it fills was kept out of the
        slack already (a batch job on the GPUs batch's reserved_gpus keeps breaks no
        hold); beyond that - its class's reservation already held - it takes from the
        slack like any job (seed 13765: a batch job restarted beside a training
        preemptor's hold took the GPUs production inference's reservation needed)."""
        name = job.cls.name
        if name == c.cls:
            return x, 0
        d = min(job.units, c.gunfilled.get(name, 0))
        if not d:
            return x, 0
        held = sum(c.gunfilled.values())
        return x - (-(-held // GPU_UNITS) - -(-(held - d) // GPU_UNITS)), d

    def _add_point(self, p: float, free_at: dict[int, int] | None = None) -> None:
        """A new claim point: the spare of every node and quota key that a claim active
        at ``p`` touches, computed from the book and those claims."""
        active = [c for c in self.claims if not c.hold and c.start <= p < c.end]
        nodes = {n for c in active for n in c.gpus}
        keys = {k for c in active for k in c.quota}
        # the walk's counts are by planned ends; at a point at or before now the spare
        # reads the GPUs free now, a job past its planned end busy (note 086)
        if free_at is not None and len(active) == 1 and nodes <= free_at.keys() and p > self.book.now:
            self.spare[p] = {n: free_at[n] - active[0].gpus[n] for n in sorted(nodes)}
        else:
            self.spare[p] = {n: self._spare_fresh(n, p) - sum(c.gpus.get(n, 0) for c in active)
                             for n in sorted(nodes)}
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
        still running at ``p`` by their planned ends (those charged to ``k``: note 046)."""
        book = self.book
        used = book.quota.usage.get(k, 0) - book.ends_by_key.released(book.jobs, k, p)
        return book.quota.current[k[0]] - used

    # ------------------------------------------------------------- queries
    def binding_points(self, end: float) -> list[float]:
        """Claim points a run ending at ``end`` (now onwards) covers."""
        pts = self.points
        if not pts or pts[0] >= end:
            return []
        return [p for p in pts if p < end]

    def touched(self, points: list[float]) -> set[int]:
        """Nodes whose GPUs a hold or a reservation at one of ``points`` (the binding
        points of a run: a prefix of the profile's points) claims."""
        found = self._touched.get(len(points))
        if found is None:
            found = set(self.held_now)
            for p in points:
                found.update(self.spare[p])
            self._touched[len(points)] = found
        return found

    def node_cap(self, job_id: str, n: int, free: int, end: float, exempt: tuple = ()) -> int:
        """The most GPUs of node ``n`` (``free`` of them free now) a job may take now for
        a run ending at ``end`` without delaying a claim (the reservations in ``exempt``
        do not bind it: their jobs would reclaim its GPUs)."""
        cap = free
        held = self.held_now.get(n)
        if held:
            cap -= sum(c for claim, c in held if claim.job_id != job_id)
        for p in self.binding_points(end):
            s = self.spare[p].get(n)
            if s is not None:
                if exempt:
                    s += sum(c.gpus.get(n, 0) for c in exempt if c.start <= p < c.end)
                if s < cap:
                    cap = s
        return max(0, cap)

    def reclaimers_of(self, job: Job) -> tuple:
        """The reservations in ``job``'s cohort that do not bind it. While it borrows (its
        member over its nominal quota once it runs): those of another member's job that
        either waits for its own team's hard limit now (its idle quota is lent: a
        lender's waiting job does not stop others from borrowing, scenario S07) or could
        reclaim ``job``'s GPUs at its start (within its nominal quota then; Kueue's
        ``reclaimWithinCohort``): ``job`` may take their GPUs. While it does not borrow:
        those of another member's job that would borrow at its start, GPUs ``job``
        would reclaim from it then (a lender's job is not kept waiting for a borrower
        whose start it would undo a second later; issue 20, scenario V2-16)."""
        book = self.book
        if job.cohort is None or not self.claims:
            return ()
        cohort, member = job.cohort
        usage = book.quota.usage
        within = usage.get((member.limit, ""), 0) + job.units <= member.nominal * GPU_UNITS
        reclaims = book.rules.preemption_enabled and cohort.reclaim != "never"
        if within and (not reclaims or job.shape.mode == "share"):
            return ()  # a share reclaims nothing
        out = []
        for c in self.claims:
            if c.hold:
                continue
            r = book.jobs[c.job_id]
            if r.cohort is None or r.cohort[0] is not cohort or r.cohort[1] is member:
                continue
            if within:  # may job reclaim r's GPUs at r's start?
                if (r.evictable and not (cohort.reclaim == "lower_priority" and r.cls.priority >= job.cls.priority)
                        and self._held_at(r.cohort[1], c.start) + r.units > r.cohort[1].nominal * GPU_UNITS):
                    out.append(c)
                continue
            if c.lend:
                out.append(c)
                continue
            if (not reclaims or not job.evictable
                    or (cohort.reclaim == "lower_priority" and job.cls.priority >= r.cls.priority)):
                continue
            if self._held_at(r.cohort[1], c.start) + r.units <= r.cohort[1].nominal * GPU_UNITS:
                out.append(c)
        return tuple(out)

    def _held_at(self, member, t: float) -> int:
        """The units cohort member ``member`` holds still at ``t`` (its running jobs
        planned to end by then left out)."""
        book = self.book
        used = book.quota.usage.get((member.limit, ""), 0)
        for end, _seq, jid in book.ends:
            if end > t:
                break
            holder = book.jobs[jid]
            if holder.cohort is not None and holder.cohort[1] is member:
                used -= holder.run_units
        return used

    def quota_cap(self, job_id: str, k: Key, headroom: int, end: float, exempt: tuple = (), victims=()) -> int:
        """The most of limit key ``k`` (``headroom`` left of it now) a job may take now for a
        run ending at ``end`` without delaying a claim (``exempt``: as ``node_cap``);
        ``victims``: a preemption plan's, gone (``freed.quota_freed``, note 067)."""
        cap = headroom
        held = self.quota_held.get(k)
        if held:
            cap -= sum(a for claim, a in held if claim.job_id != job_id)
        for p in self.binding_points(end):
            s = self.qspare[p].get(k)
            if s is None:
                continue
            if exempt:
                s += sum(c.quota.get(k, 0) for c in exempt if c.start <= p < c.end)
            if victims:
                s += quota_freed(victims, k, p, [c for c in self.owners[p] if k in c.quota and c not in exempt
                                                 and c.job_id != job_id])
            cap = min(cap, s)
        return cap

    def blocker(self, job_id: str, counts: Counts, charges, end: float, free_of, headroom_of,
                exempt: tuple = ()) -> Claim | None:
        """The first claim (holds first, then reservations in order; not those in
        ``exempt``) that a job placed on ``counts`` with ``charges``, ending at ``end``,
        would delay; ``None``."""
        for claim in self.claims:
            if claim.job_id == job_id or claim in exempt:
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
                    found = next((c for c in self.owners[p] if n in c.gpus and c not in exempt), None)
                    if found is not None:
                        return found
        return None

    # ------------------------------------------------------------- changes
    def consume(self, job: Job, counts: Counts, end: float, charges, start: float | None = None) -> bool:
        """A job started now on ``counts`` with ``charges``, planned to end at ``end``:
        it takes from the spare of every claim point it outlives (and from the class-hold
        slack of the claims it outlives). ``start``: it holds ``counts`` only from then on
        (a share joining a card keeps the card's GPU from then: it takes that GPU from the
        class-hold slack only of reservations starting then or later - a hold's slack
        counts free GPUs and its victims' only, never a card other jobs hold; oracle
        seed 59). Of every claim it outlives, it fills the unfilled reservation of its
        class that the slack counted (``takes``), wherever it runs - a card it joins, a
        MIG slice - as a restored core's slack counts it (note 078). ``True`` when it
        filled some of that (``again.after_start``)."""
        self.consumed_until = max(self.consumed_until, INF if job.shape.mode == "share" else end)
        filled = False
        if self.book.reserved:
            x = sum(c for _n, c in counts)
            for c in self.claims:
                if c.gslack is not None and (c.hold or c.start < end):
                    holds_gpu = start is None or (not c.hold and c.start >= start)
                    took, d = self.takes(c, job, x if holds_gpu else 0)
                    c.gslack -= took
                    if d:
                        c.gunfilled[job.cls.name] -= d
                        filled = True
        for p in self.binding_points(end):
            if start is not None and p < start:
                for i, user, a in charges:
                    if (i, user) in self.qspare[p]:
                        self.qspare[p][(i, user)] -= a
                continue
            sp = self.spare[p]
            for n, x in counts:
                if n in sp:
                    sp[n] -= x
            qs = self.qspare[p]
            for i, user, a in charges:
                if (i, user) in qs:
                    qs[(i, user)] -= a
        return filled

    def drop_hold(self, job_id: str) -> None:
        """Forget a preemptor's hold (it started, or its victims left and it does not fit)."""
        dropped = [c for c in self.claims if c.hold and c.job_id == job_id]
        for claim in dropped:
            self.claims.remove(claim)
            self._touched.clear()
            for table in (self.held_now, self.quota_held):
                for k in list(table):
                    table[k] = [(c, a) for c, a in table[k] if c is not claim]
                    if not table[k]:
                        del table[k]
        if dropped and self.book.reserved:
            # the class-hold slack of every other claim counted the dropped hold's GPUs as
            # taken: worked out again on the state now (a preemptor starting on its plan
            # would otherwise be charged its GPUs twice, seed 7641)
            self._hold_slacks()
            for c in self.claims:
                if not c.hold and c.gslack is not None:
                    c.gslack = class_slack(self.book, c.cls, c.start, self.claims, c)

    def reservation_of(self, job_id: str) -> Claim | None:
        for claim in self.claims:
            if claim.job_id == job_id:
                return claim
        return None


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


def held_for(book, cls: str, p: float, claims, gone=frozenset(), unfilled: dict | None = None) -> int:
    """Units other classes' ``reserved_gpus`` keep free at ``p`` for a job of ``cls``: each
    reserved class's reservation less its claims active at ``p`` and its jobs running then
    (planned ends; at now all, as ``free_total_at`` counts them: seed 302256), but for those
    in ``gone`` (victims that will have left). ``unfilled``: filled with that part per class."""
    held = 0
    for name, res in book.reserved.items():
        if name == cls:
            continue
        jobs = book.class_jobs.get(name, {}).values()
        used = sum(j.run_units for j in jobs if (j.end_est > p or p <= book.now) and j.id not in gone)
        used += sum(sum(c.gpus.values()) * GPU_UNITS for c in claims if c.cls == name and c.start <= p < c.end)
        held += max(0, res - used)
        if unfilled is not None and res > used:
            unfilled[name] = res - used
    return held


def class_slack(book, cls: str, p: float, claims, into: Claim | None = None) -> int:
    """Whole GPUs free at ``p`` (planned ends) less those the claims active then take,
    less what other classes' ``reserved_gpus`` keep free for a job of ``cls``. ``into``:
    the claim whose slack this is (it keeps what was counted: ``Claim.gunfilled``)."""
    free = free_total_at(book, p)
    free -= sum(sum(c.gpus.values()) for c in claims if not c.hold and c.start <= p < c.end)
    free -= sum(c.total_at(p) for c in claims if c.hold)
    unfilled = None
    if into is not None:
        unfilled = into.gunfilled = {}
    held = held_for(book, cls, p, claims, unfilled=unfilled)
    return free - -(-held // GPU_UNITS)


def _coming(book, job_id: str) -> int:
    """The whole GPUs the victims of preemptor ``job_id`` free (``freed.freed_count``)."""
    return freed_count(book.ledger, [book.jobs[vid] for vid in sorted(book.jobs[job_id].victims)])

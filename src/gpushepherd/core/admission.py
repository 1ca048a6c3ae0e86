"""The one admission rule (design note 015, section 1): may a pending job start now,
where, and if not, which rule refuses it first.

Every path that starts a job asks ``Admission.decide``: the pass, a preemptor whose
victims left, a preemption or reclaim plan (on a ``Scratch`` state in which the victims
are gone, KAI's ``Statement``), shares, and the reason ``shepherd why`` shows. Rules in
precedence order (the first that refuses is the reason):

1. ``HARD_NEVER``   a limit the job exceeds even at its loosest window;
2. ``HARD_NOW``     a hard limit now (team, user, class, parent, running jobs, window);
3. ``NEVER_FITS``   the healthy nodes it may use, all empty, minus other classes'
                    ``reserved_gpus``;
4. ``ORDER``        an earlier pending job of its strict FIFO queue that may use the
                    same nodes (``queueing: strict_fifo``, note 031);
5. ``FREE``         a placement on the free GPUs;
6. ``COHORT``       the cohort's capacity;
7. ``ANTI``         class anti-affinity (``avoid_nodes_with``);
8. ``CLASS_HOLD``   other classes' ``reserved_gpus`` left free (a share: no fresh GPU,
                    nor a card only a short reserved class holds, they need);
9. ``CLAIMS``       holds of preemptors and reservations it would delay (GPUs, quota).

(Notes before 031 number the rules from ``FREE`` one lower: rule 4 there is ``FREE``.)
A job that passes all nine starts on the best placement satisfying all of them at once
(best fit, NVLink islands, model-cache locality; shares on the tightest card).
"""

from __future__ import annotations


from gpushepherd.core import pins, typed
from gpushepherd.core.filters import share_can_join
from gpushepherd.core.freed import card_relief, freed_parts, reserved_at_exit
from gpushepherd.core.placement import (Counts, best_fit_island, fits_island, members_of, place_counts,
                                        place_live, tightest_in_buckets)
from gpushepherd.core.profile import Claim, Profile
from gpushepherd.core.state import INF, Job
from gpushepherd.core.shares import ShareRules
from gpushepherd.core.verdict import (ADMITTED, ANTI, CAPACITY_RULES, CLAIMS, CLASS_HOLD, COHORT, FREE,  # noqa: F401
                                      HARD_NEVER, HARD_NOW, NEVER_FITS, ORDER, RESERVABLE, Verdict,
                                      stops_strict_order)
from gpushepherd.model.job import GPU_UNITS, JobState


class Scratch:
    """The allocation as it would be with ``victims`` gone (nothing in the book changes):
    their GPUs in service are free (a shared card's once all its holders are among
    them: ``freed.freed_parts``), their charges and class units released."""

    __slots__ = ("book", "victims", "freed", "free_total", "quota", "class_units", "covered", "node_classes",
                 "ends", "relief", "at_exit")

    def __init__(self, book, victims: list[Job]):
        self.book = book
        self.victims = victims
        ledger = book.ledger
        self.freed: dict[int, int] = {}  # node -> mask of whole GPUs freed
        self.ends: list[tuple[int, int, float]] = []  # (node, GPUs, the victim's planned end)
        self.quota: dict[tuple[int, str], int] = {}
        self.class_units: dict[str, int] = {}
        self.covered: dict[str, int] = {}
        freed_n = 0
        for idx, m, end in freed_parts(ledger, victims):  # a shared card once all its holders go (note 042)
            self.freed[idx] = self.freed.get(idx, 0) | m
            self.ends.append((idx, m.bit_count(), end))
            freed_n += m.bit_count()
        #: shared cards some holders of which are victims: ``(node, GPU) -> (milli, MiB,
        #: slots)`` they give back (a card they all leave is in ``freed``; note 042)
        self.relief = card_relief(ledger, victims, self.freed)
        for v in victims:
            for i, user, a in v.run_charges:
                self.quota[(i, user)] = self.quota.get((i, user), 0) + a
            self.class_units[v.cls.name] = self.class_units.get(v.cls.name, 0) + v.run_units
            if v.covered:
                self.covered[v.cls.name] = self.covered.get(v.cls.name, 0) + v.covered
        self.free_total = ledger.free_total + freed_n
        self.at_exit = reserved_at_exit(book, victims, freed_n)  # rule 8 also at their exit (note 090)
        self.node_classes = None
        if book.anti:
            table = [dict(on) for on in book.node_classes]
            for v in victims:
                for idx, _mask in v.alloc:
                    on = table[idx]
                    on[v.cls.name] -= 1
                    if not on[v.cls.name]:
                        del on[v.cls.name]
            self.node_classes = table

    def free(self, n: int) -> int:
        return self.book.ledger.slots[n].free + self.freed.get(n, 0).bit_count()

    def free_mask(self, n: int) -> int:
        return self.book.ledger.slots[n].free_mask | self.freed.get(n, 0)

    def extra_at(self, n: int, p: float) -> int:
        """GPUs of node ``n`` the victims free that the spare at claim point ``p`` counts
        as held: those planned past ``p``, and at a point at or before now all of them
        (the spare there reads the GPUs free now: ``releases.free_mask_at``; a victim
        past its planned end holds its GPUs until it is evicted, note 086)."""
        now = self.book.now
        return sum(g for idx, g, end in self.ends if idx == n and (end > p or p <= now))


class Admission(ShareRules):
    """The admission rule over one book. Subclasses may change where shares go
    (``share_spot``), as the node best-fit baseline does."""

    def __init__(self, book):
        self.book = book
        #: the reservations that do not bind the job being decided (``Profile.reclaimers_of``)
        self._exempt: tuple = ()
        #: a share: the cards it may not join - rule 8's (``ShareRules._kept_cards``), and
        #: in rule 9 those where it would delay a claim
        self._kept: dict[tuple[int, int], str] = {}

    # ---------------------------------------- per-GPU-type quotas (note 038)
    def decide(self, job: Job, profile: Profile | None, scratch: Scratch | None = None,
               before_claims=None, no_room: bool = False, memo: dict | None = None,
               within: dict[int, int] | None = None) -> Verdict:
        """The admission rule (``_decide``). A job of several GPU types that per-type
        quotas charge by its placement (``Job.variants``) is decided once per type, in
        ``Rules.gpu_types`` order when it is at rest (bound to its base): the first type
        that admits it wins; refused on all, the verdict of the type closest to starting
        (``_TYPE_RANK``; a capacity refusal where it may reclaim lent GPUs first; then type
        order) is the answer, its index in ``Verdict.variant``.
        The job's binding is left as it was (``typed.py``). A job bound to one type (a
        preemptor, a preemption plan of its turn) is decided on that type only."""
        if not job.variants or not typed.at_rest(job):
            return self._decide(job, profile, scratch, before_claims, no_room, memo, within)
        from gpushepherd.core.preemption import may_reclaim  # (preemption imports this module)

        best, best_rank = None, 0
        with typed.bound(job, 0):
            for n, var in enumerate(job.variants):
                typed.bind(job, var)
                v = self._decide(job, profile, scratch, before_claims, no_room, memo, within)
                v.variant = n
                if v.admitted:
                    return v
                rank = _TYPE_RANK[v.rule]
                if v.rule in CAPACITY_RULES and job.shape.mode != "share" and may_reclaim(self.book, job):
                    rank -= len(_TYPE_RANK)  # it may take lent GPUs of this type back: first
                if best is None or rank < best_rank:
                    best, best_rank = v, rank
        return best

    # ----------------------------------------------------------- the rule
    def _decide(self, job: Job, profile: Profile | None, scratch: Scratch | None = None,
                before_claims=None, no_room: bool = False, memo: dict | None = None,
                within: dict[int, int] | None = None) -> Verdict:
        """Apply rules 1-9 to ``job`` now (on ``scratch`` when given). ``before_claims``
        is called once rules 1-8 admit it, before rule 9 reads ``profile`` (the pass
        computes its deferred reservations then). ``no_room``: the caller knows rule 5
        refuses it (a pass's memo), so no placement is tried. ``memo``: a pass's record
        of placements the claims refused (``(filter, binding points, class) -> least
        GPUs refused``; claims only grow during a pass, so more GPUs are refused too).
        The blocker of a ``CLAIMS`` verdict is named by ``blocker_of`` when a reason is
        asked for. ``within``: place only on these GPUs per node (a preemptor on its plan)."""
        if job.shape.mode == "share":
            return self._decide_share(job, profile, scratch, before_claims)
        book = self.book
        self._exempt = ()
        units = job.units
        covered = self._coverage(job, units, scratch, profile) if book.reserved else 0
        charges = book.charges_with(job, units, covered) if covered else job.charges
        v = self._rules_1_to_4(job, charges, scratch)
        if v is not None:
            return v
        counts = None if no_room else self._place(job, scratch, within=within)
        if counts is None:
            return Verdict(FREE, units=units, charges=charges)
        if job.cohort is not None:
            hit = self._blocking(charges, True, scratch)
            if hit is not None:
                return Verdict(COHORT, limit=hit, units=units, charges=charges)
        avoided = frozenset()
        if book.anti and job.cls.avoid:
            avoided = book.avoided_nodes(job, scratch.node_classes if scratch is not None else None)
            if avoided and any(n in avoided for n, _c in counts):
                counts = self._place(job, scratch, avoided, within=within)
                if counts is None:
                    return Verdict(ANTI, units=units, charges=charges)
        if book.reserved:
            holder = self._class_hold(job, units, scratch)
            if holder:
                return Verdict(CLASS_HOLD, holder=holder, units=units, charges=charges)
        if before_claims is not None:
            before_claims()
        # read once the claims are all there: a deferred reservation may exempt this job
        self._exempt = profile.reclaimers_of(job) if profile and book.rules.cohorts else ()
        if profile:
            end = book.now + job.planned_run()
            if book.anti and job.cls.avoid:
                kept, first = profile.avoiding(job, end, self._exempt)
                if kept and any(n in kept and n not in avoided for n, _c in counts):
                    # its class would keep a claim's job off the claim's node
                    avoided = avoided | kept
                    counts = self._place(job, scratch, avoided, within=within)
                    if counts is None:
                        return Verdict(CLAIMS, units=units, charges=charges, blocker=first)
            points = profile.binding_points(end)
            if profile.held_now or points:
                mkey = None
                if memo is not None and scratch is None:
                    mkey = (job.fkey, tuple(points), job.cls.name if avoided else "",
                            tuple(c.job_id for c in self._exempt))
                    if memo.get(mkey, INF) <= job.shape.k:
                        return Verdict(CLAIMS, units=units, charges=charges)
                caps = self._caps(job, profile, counts, end, scratch)
                if caps is not None:
                    counts = self._place(job, scratch, avoided, caps, within)
                    if counts is None:
                        if mkey is not None:
                            memo[mkey] = min(memo.get(mkey, INF), job.shape.k)
                        return Verdict(CLAIMS, units=units, charges=charges)
                if book.preemptors and job.shape.k > 1 and job.shape.mode == "single":
                    # one NVLink island outside the GPUs a hold pins (note 054)
                    held, first = pins.pinned(book, profile, job, self._exempt)
                    on = next((n for n, _c in counts if n in held), None)
                    if on is not None:
                        counts = self._place(job, scratch, avoided, caps, within, held)
                        if counts is None:
                            return Verdict(CLAIMS, units=units, charges=charges, blocker=first[on])
            if self._quota_claimed(job, profile, charges, end, scratch):
                return Verdict(CLAIMS, units=units, charges=charges)
            if book.reserved:
                blocker = profile.class_blocker(job, job.shape.k, end, self._exempt)
                if blocker is not None:
                    return Verdict(CLAIMS, units=units, charges=charges, blocker=blocker)
        return Verdict(ADMITTED, counts=counts, units=units, charges=charges, covered=covered)

    def blocker_of(self, job: Job, profile: Profile, charges: tuple | None = None) -> Claim | None:
        """The claim a user is told a job refused by rule 9 (now, live) waits for: the
        first (holds first, then reservations in order) that its best placement without
        claims would delay, else the first claiming a node it may use."""
        end = self.book.now + job.planned_run()
        self._exempt = profile.reclaimers_of(job)
        return self._blocker(job, profile, job.charges if charges is None else charges, end)

    # ----------------------------------------------------------- rules 1-4
    def _rules_1_to_4(self, job: Job, charges: tuple, scratch: Scratch | None) -> Verdict | None:
        """The refusal of rules 1-4 (hard limits, never fits, a strict FIFO queue's
        order), else ``None``. A hard limit that binds now is no reason for a job that
        can never fit: that is."""
        if charges:
            v = self._hard(charges, scratch)
            if v is not None:
                return Verdict(NEVER_FITS) if v.rule == HARD_NOW and self.never_fits(job) else v
        if self.never_fits(job):
            return Verdict(NEVER_FITS)
        if job.strict_q is not None and job.id not in self.book.preemptors:
            # a preemptor passed its queue's order when it preempted: its victims' work
            # is spent on it, whoever has come ahead of it since
            head = self.head_ahead(job)
            if head is not None:
                return Verdict(ORDER, charges=charges, head=head.id)
        return None

    def head_ahead(self, job: Job) -> Job | None:
        """Rule 4: the earliest pending job ahead of ``job`` in its strict FIFO queue
        (Kueue's ``StrictFIFO``) that may use a node ``job`` may use and could ever start;
        ``None``: nobody holds it back. A head waiting for other GPU types or pools, or
        one no limit or node could ever take, holds back nobody; a preemptor whose
        victims are leaving for it is held back by nobody (note 031)."""
        book = self.book
        mine = None
        for key, head in book.queue.strict.get(job.strict_q, ()):
            if key >= job.key:
                break
            if head.state is not JobState.PENDING:
                continue  # started earlier in this pass
            if mine is None:
                mine = book.nodes_for(job)
            # per GPU type (note 038): on some type it may use that could ever take it
            if not typed.any_variant(head, lambda h: not mine.isdisjoint(book.nodes_for(h))
                                     and self.may_ever_start(h, h.charges)):
                continue
            return head
        return None

    def may_ever_start(self, job: Job, charges: tuple) -> bool:
        """Whether some time of the week and the healthy nodes allow ``job`` charged
        ``charges``: no limit it exceeds at its loosest, no windowed limits that never
        open together for it, and a placement on the nodes all empty (``never_fits``)."""
        quota = self.book.quota
        return (quota.never_fits(charges) is None and quota.never_together(charges) is None
                and not self.never_fits(job))

    def _hard(self, charges: tuple, scratch: Scratch | None) -> Verdict | None:
        quota = self.book.quota
        for i, _user, amount in charges:
            if amount > quota.limits[i].loosest * quota.scale[i]:
                if quota.limits[i].gpu_type is not None:  # one of every GPU type refuses it on all: named first
                    i = next((j for j, _u, a in charges if quota.limits[j].gpu_type is None
                              and a > quota.limits[j].loosest * quota.scale[j]), i)
                return Verdict(HARD_NEVER, limit=(i, 0), charges=charges)
        hit = self._blocking(charges, False, scratch)
        if hit is not None:
            if quota.windowed:
                j = quota.never_together(charges)
                if j is not None:  # windows that never open together for it
                    return Verdict(HARD_NEVER, limit=(j[0], 1), charges=charges)
            return Verdict(HARD_NOW, limit=hit, charges=charges)
        return None

    def _blocking(self, charges: tuple, cohort: bool, scratch: Scratch | None) -> tuple[int, int] | None:
        """The first limit (policy order) the charges exceed now: hard limits, or with
        ``cohort`` the cohort capacity limits; ``(limit index, usage)``."""
        quota = self.book.quota
        usage, current, cohorts = quota.usage, quota.current, quota.cohort_limits
        freed = scratch.quota if scratch is not None else None
        for i, user, amount in charges:
            if (i in cohorts) != cohort:
                continue
            used = usage.get((i, user), 0)
            if freed:
                used -= freed.get((i, user), 0)
            if used + amount > current[i]:
                return i, used
        return None

    def never_fits(self, job: Job) -> bool:
        """The job can never fit the healthy nodes it may use, even all empty (too big
        for any node, for all of them together, a gang that cannot be packed), or more
        GPUs than other classes' ``reserved_gpus`` ever leave."""
        book = self.book
        key = (job.fkey, job.shape.k)
        never = book.cap_cache.get(key)
        if never is None:
            ledger = book.ledger
            if job.shape.mode == "share":
                never = self._share_never_fits(job)
            elif job.shape.mode == "multi":
                # on every node empty, the multi rule (whole nodes largest first while they
                # fit what is left, then one remainder node) fails only when the GPUs do not
                # add up: a node it skipped has more than is left (note 046)
                never = ledger.healthy_in(book.groups_for(job)) < job.shape.k
            elif job.shape.mode == "single" and not job.shape.island and _all_healthy(ledger, book.groups_for(job)):
                # best fit on every node empty fails only when no node has k GPUs
                never = max((ledger.groups[g].gpus for g in book.groups_for(job) if ledger.groups[g].members),
                            default=0) < job.shape.k
            else:
                cand = members_of(ledger, book.groups_for(job))
                totals = {i: ledger.slots[i].healthy for i in cand}
                never = place_counts(dict(totals), cand, totals, job.shape) is None or (
                    job.shape.island and best_fit_island(totals, cand, job.shape.k, ledger.slots, True) is None)
            book.cap_cache[key] = never
        if not never and book.reserved:
            other = sum(r for c, r in book.reserved.items() if c != job.cls.name)
            if job.shape.mode != "share":
                never = job.units > book.ledger.healthy_total * GPU_UNITS - other
            elif job.share.kind != "mig" and book.ledger.healthy_total * GPU_UNITS - other < GPU_UNITS:
                # it could only join a card; one may be opened only by a class the
                # reservations do not keep from a fresh GPU (a reserved class that may
                # take this kind of share), and the card stays that class's while the
                # class holds less than its reservation (rule 8: ``ShareRules._kept_cards``)
                # - for ever unless MIG instances may hold reservations (its cards hold
                # it only once full, but for shares charged by different dimensions: a
                # fraction by SMs beside one by memory)
                ledger = book.ledger
                kind = job.share.kind
                classes = book.rules.classes
                never = not any(slot.migs for slot in ledger.slots) or not any(
                    c != job.cls.name and (classes[c].sharing is None or kind in classes[c].sharing)
                    for c in book.reserved)
                if not never:  # and only if it leaves room for that class's job on a card
                    never = not any(share_can_join(ledger.groups[g].node, job.share) for g in book.groups_for(job))
        return never

    # ----------------------------------------------------------- rules 6-8
    def _coverage(self, job: Job, units: int, scratch: Scratch | None, profile: Profile | None = None) -> int:
        """Units of a run of ``units`` starting now its class's ``reserved_gpus`` would
        cover: what running jobs and preemptors' holds (other than the job's own) leave."""
        book = self.book
        res = book.reserved.get(job.cls.name)
        if not res:
            return 0
        used = book.covered_units.get(job.cls.name, 0)
        if scratch is not None:
            used -= scratch.covered.get(job.cls.name, 0)
        if profile:
            used += sum(c.covered for c in profile.claims if c.hold and c.job_id != job.id and c.cls == job.cls.name)
        return max(0, min(units, res - used))

    def _class_hold(self, job: Job, units: int, scratch: Scratch | None) -> str:
        """The first class (policy order) whose ``reserved_gpus`` the job would take;
        '' when the free GPUs left after it cover every other class's reservation - on
        a scratch state both now and at the victims' exit (``Scratch.at_exit``)."""
        book = self.book
        free = scratch.free_total if scratch is not None else book.ledger.free_total
        exit_ = [scratch.at_exit] if scratch is not None and scratch.at_exit else []
        for gone, more, _ids in ((None, 0, ()), *exit_):
            held = 0
            holder = ""
            for name, res in book.reserved.items():
                if name == job.cls.name:
                    continue
                used = book.class_units.get(name, 0)
                if scratch is not None:
                    used -= scratch.class_units.get(name, 0) + (gone.get(name, 0) if gone else 0)
                if used < res:
                    held += res - used
                    holder = holder or name
            if held and (free + more) * GPU_UNITS - units < held:
                return holder
        return ""

    # ------------------------------------------------------------ rule 9
    def _caps(self, job: Job, profile: Profile, counts: Counts, end: float,
              scratch: Scratch | None) -> dict[int, int] | None:
        """Per candidate node, the GPUs the claims leave the job; ``None`` when the
        placement ``counts`` is within them already (it is then the best one)."""
        points = profile.binding_points(end)
        if not profile.held_now and not points:
            return None
        touched = profile.touched(points)
        if all(n not in touched or x <= self._cap(job, profile, n, end, scratch) for n, x in counts):
            return None
        nodes = self.book.nodes_for(job)
        return {n: self._cap(job, profile, n, end, scratch) for n in sorted(touched) if n in nodes}

    def _cap(self, job: Job, profile: Profile, n: int, end: float, scratch: Scratch | None) -> int:
        exempt = self._exempt
        if scratch is None:
            return profile.node_cap(job.id, n, self.book.ledger.slots[n].free, end, exempt)
        cap = scratch.free(n)
        held = profile.held_now.get(n)
        if held:
            cap -= sum(c for claim, c in held if claim.job_id != job.id)
        for p in profile.binding_points(end):
            s = profile.spare[p].get(n)
            if s is not None:
                s += scratch.extra_at(n, p)
                if exempt:
                    s += sum(c.gpus.get(n, 0) for c in exempt if c.start <= p < c.end)
                cap = min(cap, s)
        return max(0, cap)

    def _quota_claimed(self, job: Job, profile: Profile, charges: tuple, end: float,
                       scratch: Scratch | None) -> bool:
        """Whether the claims' quota leaves the job too little of a limit it counts in."""
        if not charges or (not profile.quota_held and not profile.binding_points(end)):
            return False
        quota = self.book.quota
        for i, user, amount in charges:
            k = (i, user)
            used = quota.usage.get(k, 0) - (scratch.quota.get(k, 0) if scratch is not None else 0)
            if amount > profile.quota_cap(job.id, k, quota.current[i] - used, end, self._exempt,
                                          scratch.victims if scratch is not None else ()):
                return True
        return False

    def _blocker(self, job: Job, profile: Profile, charges: tuple, end: float) -> Claim | None:
        """The claim a user is told the job waits for: the first that its best
        placement without claims (on the live book) would delay."""
        book = self.book
        counts = self._place(job, None) or []
        quota = book.quota

        def free_of(n: int) -> int:
            return book.ledger.slots[n].free

        def headroom_of(k) -> int:
            return quota.current[k[0]] - quota.usage.get(k, 0)

        exempt = self._exempt
        found = profile.blocker(job.id, counts, charges, end, free_of, headroom_of, exempt)
        if found is None:
            found = next((c for c in profile.claims if c.job_id != job.id and c not in exempt
                          and (c.hold or end > c.start)
                          and (not book.nodes_for(job).isdisjoint(c.gpus) or c.quota)), None)
        return found

    # ---------------------------------------------------------- placement
    def _place(self, job: Job, scratch: Scratch | None, avoided: frozenset = frozenset(),
               caps: dict[int, int] | None = None, within: dict[int, int] | None = None,
               held: dict[int, int] | None = None) -> Counts | None:
        """Best fit for a whole-GPU job on free GPUs (``scratch``'s when given), away from
        ``avoided`` nodes and within ``caps``; nodes holding its (preferred) cache key
        first; single-node multi-GPU jobs on nodes where they fit one NVLink island first
        (outside the GPUs ``held``, per node, pins: ``pins.pinned``). ``within``: only a
        preemptor's plan; one over several nodes is placed as counted, or not at all, its
        shape now notwithstanding (notes 073, 077)."""
        book = self.book
        ledger = book.ledger
        groups = book.groups_for(job)
        shape = job.shape
        islands = shape.k > 1 and shape.mode == "single" and book.on_islands(job)
        key = job.spec.cache_key
        tiered = key and not job.spec.cache_required
        if within is not None:  # only the GPUs of a plan, no more than it counted per node
            cand = [i for i in members_of(ledger, groups) if i in within and i not in avoided]
            if shape.island:  # note 037: only nodes where it fits one island
                cand = [i for i in cand if fits_island((scratch.free_mask(i) if scratch is not None
                                                        else ledger.slots[i].free_mask) & ~(held or {}).get(i, 0),
                                                       shape.k, ledger.slots[i].node.nvlink_islands)]
            avail = {i: min(scratch.free(i) if scratch is not None else ledger.slots[i].free, within[i],
                            caps.get(i, within[i]) if caps is not None else within[i]) for i in cand}
            if shape.mode == "multi" or (shape.mode == "single" and len(within) > 1):
                # its plan, as counted: a node it took whole stays whole for it when a GPU
                # there comes into service since (note 073), and a plan over several nodes
                # stays its placement when a node added since makes it fit one (note 077)
                return list(within.items()) if all(avail.get(i, 0) >= c for i, c in within.items()) else None
            return place_counts(avail, cand, {i: ledger.slots[i].healthy for i in cand}, shape)
        if (scratch is None and not avoided and not islands and not tiered and caps is not None
                and shape.mode == "single"):
            return _best_fit_capped(ledger, groups, shape.k, caps)
        if scratch is None and not avoided and caps is None and not islands:
            if tiered:
                cached = [g for g in groups if key in ledger.groups[g].node.cached]
                if cached and len(cached) < len(groups):
                    counts = place_live(ledger, cached, shape)
                    if counts is not None:
                        return counts
            return place_live(ledger, groups, shape)
        if islands and scratch is None and not avoided and caps is None and not tiered:
            # only nodes with k free GPUs or more can take it: read them from the
            # free-count buckets, not every node of the filter (note 046)
            k = shape.k
            cand = [i for g in groups for f in range(k, ledger.groups[g].gpus + 1) for i in ledger.groups[g].buckets[f]]
            return self._best_fit_islands(job, cand, {i: ledger.slots[i].free for i in cand}, None, held)
        cand = [i for i in members_of(ledger, groups) if i not in avoided]
        tiers = [cand]
        if tiered:
            first = [i for i in cand if key in ledger.slots[i].node.cached]
            if first and len(first) < len(cand):
                tiers = [first, cand]
        for tier in tiers:
            avail = {}
            for i in tier:
                f = scratch.free(i) if scratch is not None else ledger.slots[i].free
                if caps is not None:
                    f = min(f, caps.get(i, f))
                avail[i] = f
            totals = {i: ledger.slots[i].healthy for i in tier}
            if islands:
                counts = self._best_fit_islands(job, tier, avail, scratch, held)
            else:
                counts = place_counts(avail, tier, totals, shape)
            if counts is not None:
                return counts
        return None

    def _best_fit_islands(self, job: Job, cand: list[int], avail: dict[int, int],
                          scratch: Scratch | None, held: dict[int, int] | None = None) -> Counts | None:
        """Single-node best fit that prefers nodes where the job fits one NVLink island:
        ``(not on one island, free GPUs, node index)``; only those for a job that
        requires one (``require_island``, note 037)."""
        ledger = self.book.ledger
        k = job.shape.k
        best = None
        for i in cand:
            f = avail.get(i, 0)
            if f < k:
                continue
            slot = ledger.slots[i]
            mask = scratch.free_mask(i) if scratch is not None else slot.free_mask
            if held:
                mask &= ~held.get(i, 0)
            key = (0 if fits_island(mask, k, slot.node.nvlink_islands) else 1, f, i)
            if key[0] and job.shape.island:
                continue
            if best is None or key < best:
                best = key
        return None if best is None else [(best[2], k)]

    # ------------------------------------------------------------- shares
    def _charged(self, job: Job, units: int, scratch: Scratch | None, profile: Profile | None) -> tuple[int, tuple]:
        """``(covered, charges)`` of a run of ``units``: the part its class's
        ``reserved_gpus`` would cover, and its quota charges then."""
        covered = self._coverage(job, units, scratch, profile)
        if not covered and units == job.units:
            return 0, job.charges
        return covered, self.book.charges_with(job, units, covered)

#: per-GPU-type quotas (note 038): which type's refusal a job refused on every type
#: reads - the one closest to starting: a capacity refusal (preemption, reclaim and a
#: reservation may help), then its strict queue's order, a hard limit now, and last
#: what never fits
_TYPE_RANK = {CLAIMS: 0, CLASS_HOLD: 1, ANTI: 2, COHORT: 3, FREE: 4, ORDER: 5, HARD_NOW: 6, NEVER_FITS: 7,
              HARD_NEVER: 8}


def _all_healthy(ledger, groups: list[int]) -> bool:
    """Whether every GPU of every node of ``groups`` is healthy and whole-capable."""
    return all(ledger.groups[g].healthy_sum == len(ledger.groups[g].members) * ledger.groups[g].gpus for g in groups)


def _best_fit_capped(ledger, groups: list[int], k: int, caps: dict[int, int]) -> Counts | None:
    """Single-node best fit on the free GPUs with a few nodes capped below their free
    count (the claims'): the capped nodes by their cap, the others from the free-count
    buckets; the fewest GPUs left that still hold ``k``, then the lowest index."""
    best = None
    for n, cap in caps.items():
        f = min(ledger.slots[n].free, cap)
        if f >= k and (best is None or (f, n) < best):
            best = (f, n)
    hit = tightest_in_buckets(ledger, groups, k, caps, None if best is None else best[0])
    if hit is not None and (best is None or hit < best):
        best = hit
    return None if best is None else [(best[1], k)]

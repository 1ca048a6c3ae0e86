"""The scheduling pass, written out in one place (Kueue's ``schedule()``; design note
015, section 3). After the events of an instant:

1. expire    - time limits, memory overruns, idle stops, closing windows (``expire.py``);
2. order     - pending jobs by priority (``priority.py``; the queue is kept sorted);
3. holds     - every preemptor's hold in force; one whose victims are gone starts first;
4. admit     - each pending job in order through the admission rule (``admission.py``);
5. preempt   - a job refused for capacity may evict lower-priority work or reclaim
               lent quota, planned on a scratch copy (``preemption.py``);
6. reserve   - the first capacity-blocked jobs get reservations (``profile.py``);
7. backfill  - later jobs start only where the admission rule's claims allow.

``Turn`` is one job's turn (steps 4-6), shared by the fast pass here and by the
reference pass (``reference.py``). The fast pass visits the queue by sub-queue heads and
skips a job only when an earlier job of the pass proves it would do nothing different
(each shortcut is a lemma below); the oracle tests hold the two passes equal.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left

from gpushepherd.core import admission as A
from gpushepherd.core import again, pins, preemption, reasons, typed
from gpushepherd.core.ledger import bits
from gpushepherd.core.placement import pick_gpus
from gpushepherd.core.planning import reservation_for
from gpushepherd.core.profile import Profile
from gpushepherd.core.standing import new_starts_covered
from gpushepherd.core.state import INF, Job
from gpushepherd.model.decisions import Decision
from gpushepherd.model.job import JobState
from gpushepherd.model.placement import Placement

STARTED, PREEMPTED, RESERVED, BLOCKED, HELD = range(5)


class Turn:
    """What one pass knows while it runs: the profile of claims, the reservation depth,
    the reservations not computed yet, the jobs it started (dequeued at its end)."""

    def __init__(self, sched, out: list[Decision], dequeue_now: bool):
        self.sched = sched
        self.book = sched.book
        self.adm = sched.admission
        self.out = out
        self.profile = Profile(self.book)
        self.t = self.book.now  # deferred reservations are computed at it (``continue_fast`` moves it)
        rules = self.book.rules
        self.depth = rules.backfill_reservations if rules.backfill_enabled else 0
        self.n_reserved = 0
        self.deferred: list[Job] = []
        self.started: list[Job] = []
        self.dequeue_now = dequeue_now
        self.first_blocked: Job | None = None  # the capacity-blocked job first in queue order
        self.last_reserved: Job | None = None  # the last job given a slot of the depth
        self.acted_after_reserve = False  # a job started or preempted after the pass's first reservation
        #: the jobs given a slot of the depth, in order: ``(job, rule, GPU type variant)``
        #: of their turn; those before the pass's last start are checked by ``claims_stand``
        self.slots: list[tuple[Job, int, int]] = []
        self.slots_before_start = 0
        self.walk: "Walk | None" = None
        self.visited: dict[str, tuple[int, int]] = {}  # preemptors whose turn came in this pass -> what it gave
        #: jobs that found no victims in this pass: one started later may be theirs once of age (``again.py``)
        self.no_victims: list[Job] = []
        #: the highest class of a refused whole-GPU job with nothing below it evictable yet: a
        #: lower job started later may be its victim once it comes of age (wake-up, ``again.py``)
        self.no_victims_prio = -INF
        self.memo: dict | None = None  # the fast pass's memo of placements the claims refused (``Admission.decide``)
        #: a share was refused for room (rules 5-9): a card a later share opens may take it (``again.py``)
        self.share_refused = False
        #: a share that may preempt was refused by a capacity rule after room (6-9): a later
        #: start may leave it no room, and then it preempts (``again.py``; seeds 1323, 125940, 123639)
        self.share_may_preempt = False
        #: cohort members (teams) a job of which the claims refused in this pass: one of
        #: their jobs started later may make the member a borrower, whom the claims that
        #: lend or may reclaim no longer bind (``Profile.reclaimers_of``; ``again.py``)
        self.claims_refused: set[str] = set()  # teams of jobs the claims refused, at the turn or in a plan
        #: a job was refused by a class hold or the claims in this pass: a dropped hold, or a start
        #: filling a class's reservation with no free GPU, loosens them: another pass sees it (119025, 157825)
        self.held_back = False
        self.plan_refused = False  # a preemption plan found no victims in this pass (``again.py``)
        self.within_refused: list[Job] = []  # refused with no within-team step (``again._within_now``)
        self.order_refused: list[Job] = []  # refused by a strict queue's order (``again._binds_now``)
        self.halted = False  # a start or ``preempt`` after another pass was asked: the walk stops
        #: ``(planned end, counts)`` of each job started once the profile held a claim (``standing``)
        self.outlived: list[tuple[float, list]] = []

    # ------------------------------------------------------------- steps
    def holds(self) -> None:
        """Step 3: every preemptor's hold is in force before anyone's turn (holds bind
        every job); one whose victims are all gone starts on what it held, before anyone
        - another preemptor too (seed 311874: a share's freed room) - or lets it go; the
        others take their turns in queue order (``turn``) - without backfill first of
        all, since the strict order stops at the first job a hold blocks."""
        order = sorted(self.book.preemptors.values(), key=lambda j: j.key)
        for p in order:
            self.profile.add_hold(p)
        for p in order:
            if not p.victims and p.id not in self.visited:
                self.visited[p.id] = (STARTED, A.ADMITTED)
                v = self.adm.decide(p, self.profile, within=dict(p.plan))
                self.profile.drop_hold(p.id)
                if v.admitted:
                    self.start(p, v)
                else:
                    self.book.clear_victims(p)
                    typed.rest(p)  # every GPU type again (note 038)
                    del self.visited[p.id]  # an ordinary job now: its turn in order
        if not self.book.rules.backfill_enabled:
            for p in order:
                if p.id in self.book.preemptors and not self.halted:  # (one let go: its turn in order)
                    self.turn(p)

    def turn(self, job: Job, no_room: bool = False) -> tuple[int, int]:
        """Steps 4-6 for one pending job: ``(outcome, rule)``; ``rule`` is the first
        admission rule that refused it (``ADMITTED`` when it started). ``no_room``: the
        walk knows no free GPUs take it (rule 5).

        A preemptor starts if admitted (its own hold is free for it); it keeps its hold
        while its victims are still exiting (``HELD``); else its hold is dropped and it
        goes on like any job (it may preempt again). Its turn comes once a pass."""
        book = self.book
        if job.state is not JobState.PENDING:  # started already (the walk dequeues at its end)
            return HELD, A.ADMITTED
        preemptor = job.id in book.preemptors
        if job.id in self.visited:
            # its turn came already in this pass: the same again (refused then, it is
            # refused now - a strict order stops there, seed 10572)
            return self.visited[job.id]
        if preemptor:
            self.visited[job.id] = (HELD, A.CLAIMS)
        v = self.adm.decide(job, self.profile, before_claims=self.materialize if self.deferred else None,
                            no_room=no_room, memo=None if preemptor else self.memo)
        if not job.variants:
            return self._decided(job, v, preemptor)
        if v.variant >= 0:  # per-GPU-type quotas (note 038): its turn goes on on the type decided on
            job.tv = v.variant
            typed.bind(job, job.variants[v.variant])
        try:
            return self._decided(job, v, preemptor)
        finally:  # back at rest, unless it started or holds GPUs it planned on
            if job.state is JobState.PENDING and job.id not in book.preemptors:
                typed.rest(job)

    def _decided(self, job: Job, v: A.Verdict, preemptor: bool) -> tuple[int, int]:
        book = self.book
        if v.admitted and book.repass:  # another pass was asked: it turns this job in order (note 070)
            self.halted = True
            return BLOCKED, A.ADMITTED
        if preemptor and (v.admitted or not job.victims):  # its hold is dropped
            book.repass = book.repass or self.held_back
        self.held_back = self.held_back or v.rule in (A.CLASS_HOLD, A.CLAIMS)
        if v.admitted:
            if preemptor:
                self.profile.drop_hold(job.id)
            self.start(job, v)
            return STARTED, A.ADMITTED
        if preemptor:
            if job.victims:
                job.hold_pass = self.sched.pass_no
                return HELD, A.CLAIMS
            self.profile.drop_hold(job.id)  # its own hold never counted against it: v stands
            book.clear_victims(job)
            result = self.blocked(job, v.rule)
            self.visited[job.id] = result  # what a second look in this pass gets
            return result
        return self.blocked(job, v.rule)

    def blocked(self, job: Job, rule: int) -> tuple[int, int]:
        """A refused job: it may preempt (step 5), else take a reservation (step 6) -
        also when a hard limit refuses it now (it may fit at a later instant; a limit of
        a team that allows it may be freed by preempting within the team, note 035)."""
        if job.shape.mode == "share" and rule in A.CAPACITY_RULES:  # (again.py)
            self.share_refused = True  # a card opened later in the pass may take it
            if rule != A.FREE and not self.share_may_preempt:
                self.share_may_preempt = self.can_preempt(job)
        if rule == A.CLAIMS and job.cohort is not None:
            self.claims_refused.add(job.cohort[1].team)
        if rule not in A.RESERVABLE:
            if rule == A.ORDER and (self.depth or self.book.rules.within_team):
                self.order_refused.append(job)  # a later start may make a hard limit refuse it first
            return BLOCKED, rule
        if job.shape.mode == "share":
            if rule == A.FREE and self.can_preempt(job):  # lower shares on one card (note 042)
                if self.preempt(job, preemption.share_plan):
                    return PREEMPTED, rule
                self.no_victims.append(job)
            if A.stops_strict_order(job, rule):
                self.note_blocked(job)
            return BLOCKED, rule  # shares take no reservations
        if self.book.rules.within_team and (rule != A.HARD_NOW or not preemption.within_team(self.book, job)):
            self.within_refused.append(job)
        if rule == A.HARD_NOW:
            within = preemption.within_team(self.book, job)
            if within and self.preempt(job, preemption.plan, within):
                return PREEMPTED, rule
            if self.n_reserved < self.depth:
                job.lend = True  # its reservation lends its cohort's borrowers its GPUs
                self.deferred.append(job)
                self.slots.append((job, rule, job.tv))
                self.n_reserved += 1
                self.last_reserved = job
                return RESERVED, rule
            return BLOCKED, rule
        if not self.book.rules.preemption_enabled:
            pass  # (none of the three below: each needs preemption on)
        elif self.can_preempt(job):
            if self.preempt(job, preemption.plan):
                return PREEMPTED, rule
            self.no_victims.append(job)
        elif preemption.may_reclaim_later(self.book, job):
            self.no_victims.append(job)  # a borrower started later in the pass may be its victim
        else:
            self.no_victims_prio = max(self.no_victims_prio, job.cls.priority)
        self.note_blocked(job)
        if self.n_reserved < self.depth:
            job.lend = False
            self.deferred.append(job)
            self.slots.append((job, rule, job.tv))
            self.n_reserved += 1  # a job whose start cannot be planned still takes its slot
            self.last_reserved = job
            return RESERVED, rule
        return BLOCKED, rule

    def note_blocked(self, job: Job) -> None:
        """``first_blocked``: the capacity-blocked job first *in queue order* - without backfill
        preemptors turn before the walk (``holds``): the first refused may be another (220068)."""
        if self.first_blocked is None or job.key < self.first_blocked.key:
            self.first_blocked = job

    def preempt(self, job: Job, planner, *args) -> bool:
        """Step 5 with ``planner`` (``preemption.plan``, ``share_plan``): the preemption it
        finds begins (``True``); else a wake-up when a too-young victim would do. Once the pass
        asked for another (``book.repass``) it halts here, as a start does (``_decided``): the
        next turns all in order (305500, 341629)."""
        if self.book.repass:
            self.halted = True
            return False
        self.materialize()
        why: list = []
        found, until = planner(self.book, self.adm, self.profile, job, *args, why=why)
        if found is not None:
            self.begin_preemption(job, *found)
            return True
        self.plan_refused = True
        if job.cohort is not None and any(v.rule == A.CLAIMS for v in why):
            # a claim refused the plan: a start that changes which claims bind the job
            # (its member borrows; a claim's member would borrow at the claim's start:
            # Profile.reclaimers_of) asks for another pass, as after a refusal at its turn
            self.claims_refused.add(job.cohort[1].team)
        self.sched.wake_at(until)
        return False

    def can_preempt(self, job: Job) -> bool:
        book = self.book
        if not book.rules.preemption_enabled:
            return False
        p = job.cls.priority
        if job.shape.mode == "share":  # class preemption of shares only, never for MIG (note 042)
            return job.share.kind != "mig" and any(q < p for q in book.evictable)
        if any(q < p for q in book.evictable):
            return True
        return typed.any_variant(job, lambda j: j.cohort is not None and preemption.may_reclaim(book, j))

    def materialize(self) -> None:
        """Compute the deferred reservations, in order, before anything in the pass could
        use them or change the state they are computed from: they come out exactly as if
        computed when their job blocked - at the pass's instant (``continue_fast`` moves
        it to its own, as a full pass then would), also when a query asks for them (what
        is asked never changes what is decided)."""
        if not self.deferred:
            return
        book = self.book
        now, book.now = book.now, self.t
        try:
            while self.deferred:
                self.reserve(self.deferred.pop(0))
        finally:
            book.now = now

    def reserve(self, job: Job) -> bool:
        with typed.turned(job):  # for the GPU type its turn was decided on (note 038)
            found = reservation_for(self.book, self.profile, job)
            if found is None:
                return False
            start, counts, free_at = found
            self.profile.add_reservation(job, start, counts, "", free_at if free_at else None, job.lend)
        return True

    # ----------------------------------------------------------- actions
    def start(self, job: Job, v: A.Verdict) -> None:
        book = self.book
        if self.n_reserved:
            self.acted_after_reserve = True
            self.slots_before_start = len(self.slots)
        ledger = book.ledger
        held_from = None
        if v.spot is not None:
            idx, gpu, pos, fresh = v.spot
            slot = ledger.slots[idx]
            share = job.share
            if not fresh and pos is None:
                held_from = self.adm.card_end(idx, gpu)  # the card stays held from then
            if pos is None:
                ledger.allocate_share(job.id, idx, gpu, share.kind, share.need(slot.node))
                job.share_at = (gpu,)
                what = str(share.on(slot.node))  # as it is there: the runner's MPS limits (note 037)
            else:
                ledger.allocate_mig(job.id, idx, gpu, pos)
                job.share_at = (gpu, pos)
                what = f"mig:{share.profile}@{slot.migs[gpu].layout[pos].start}"
            alloc = [(idx, 0)]
            placement = Placement(((slot.node.name, (gpu,)),), share=what)
            counts = [(idx, 1)] if fresh or held_from is not None else []
        else:
            alloc, parts = [], []
            planned = job.hold_gpus
            for idx, c in v.counts:
                slot = ledger.slots[idx]
                mine = planned.get(idx, 0) & slot.free_mask
                if mine.bit_count() >= c:  # a preemptor on the GPUs it planned for
                    mask = pick_gpus(mine, c, slot.node.nvlink_islands)
                else:
                    mask = pins.pick_free(book, idx, c, job)
                alloc.append((idx, mask))
                parts.append((slot.node.name, bits(mask)))
            placement = Placement(tuple(parts))
            counts = v.counts
        held = job.id in book.preemptors and bool(job.victims)  # its victims are still leaving
        # its class's reservation was unfilled (rule 7 reads it), or a claim's slack counted it so
        fills = book.class_units.get(job.cls.name, 0) < book.reserved.get(job.cls.name, 0)
        book.launch(job, alloc, placement, self.out, units=v.units, dequeue=self.dequeue_now, covered=v.covered)
        if self.profile:
            fills = self.profile.consume(job, counts, job.end_est, job.run_charges, held_from) or fills
            self.outlived.append((job.end_est, counts))
        again.after_start(self, job, v.spot, held, fills)  # another pass, or a wake-up (again.py)
        self.started.append(job)

    def begin_preemption(self, job: Job, victims: list[Job], v: A.Verdict) -> None:
        """Signal ``victims`` for ``job``; what they free is held for it from now on."""
        book = self.book
        if self.n_reserved:
            self.acted_after_reserve = True
        reclaiming = job.shape.mode != "share" and preemption.may_reclaim(book, job)
        taken = [x for x in victims if reclaiming and typed.borrows_from(job, x)]
        reclaim = bool(taken)
        for x in victims:
            book.preempt(x, job, self.out, "reclaim" if x in taken else "")
        job.victims = {x.id for x in victims}
        # a share holds the GPU it opens once its victims leave a card empty (note 042)
        job.plan = list(v.counts or []) if v.spot is None else [(v.spot[0], 1)] if v.spot[3] else []
        scratch = A.Scratch(book, victims)
        job.hold_gpus = {idx: pick_gpus(pins.unpinned(book, idx, c, job, scratch.free_mask(idx)), c,
                                        book.ledger.slots[idx].node.nvlink_islands) for idx, c in job.plan}
        if v.spot is not None and not v.spot[3]:  # the card in service a share joins (``Profile.add_hold``)
            job.hold_gpus = {v.spot[0]: 1 << v.spot[1]}
        job.reclaim = reclaim
        job.hold_pass = self.sched.pass_no
        book.preemptors[job.id] = job
        book.repass = True  # its victims leave at now + grace: the profile moved
        self.profile.add_hold(job)
        job.reason = reasons.in_progress(job)
        why = "reclaiming quota from " if reclaim else "preempting "
        book.log(job, JobState.PENDING, JobState.PENDING, why + ",".join(x.id for x in victims))

    def finish(self) -> None:
        if not self.dequeue_now:
            for job in self.started:
                if job.state is not JobState.PENDING:
                    self.book.queue.remove(job)
                    if job.share is not None:
                        self.book.pending_shares -= 1


def run_fast(sched, out: list[Decision], budget: int | None = None, stop_key: tuple | None = None) -> Turn:
    """The pass over sub-queue heads (note 001's walk, made exact); see ``Walk``. ``budget``,
    ``stop_key``: a restored core's walk again (note 085); default ``backfill.max_job_test``."""
    turn = Turn(sched, out, dequeue_now=False)
    turn.holds()
    turn.memo = {}
    turn.walk = Walk(turn, budget, stop_key)
    turn.walk.run(turn)
    return turn


def resume_fast(turn: Turn, out: list[Decision]) -> None:
    """Go on with a walk its budget cut short, on the same state (nothing changed since but
    the time): the pass it completes is the one an unbounded budget would make."""
    turn.out = out
    turn.started = []
    turn.walk.resume(turn)


def continue_fast(turn: Turn, new: list[Job], out: list[Decision]) -> bool:
    """Give only the jobs submitted since ``turn``'s pass their turns, against its claims,
    when that decides what a full pass would (``False``: it does not; run one).

    Lemma: if nothing but submissions changed since the pass, nothing started or was
    preempted after its first reservation, every new job queues behind the pass's
    first capacity-blocked job and behind its last reserved one, no reservation of the
    pass began before now, and their starts change no old job's turn otherwise
    (``standing.new_starts_covered``), then a full pass would
    find every old job where this one left it - same state at each old job's turn, same
    reservations - and every new job at its turn facing exactly these claims. The
    budget must leave a test for each new job (else the full pass, cut, decides)."""
    walk = turn.walk
    if walk is None or walk.cut or turn.acted_after_reserve or walk.budget < len(new):
        return False
    cut = max((j.key for j in (turn.first_blocked, turn.last_reserved) if j is not None), default=None)
    if cut is not None and any(j.key < cut for j in new):
        return False
    if not new_starts_covered(turn, new):
        return False  # a new job's start may change what an old job behind it may do
    # reservations still deferred were read by no job of the pass: a full pass now would
    # compute them at now, on this state (only submissions since) - so they are, when
    # first needed (note 055); those computed already begin at now or later (just checked)
    turn.t = turn.book.now
    turn.out = out
    turn.started = []
    strict = not turn.book.rules.backfill_enabled
    if strict and turn.first_blocked is not None:
        return True  # no backfill: nobody passes the blocked job
    if strict and walk.stopped:
        return False  # the first job the strict order stops at was not turned (seed 13435)
    for job in sorted(new, key=lambda j: j.key):
        if turn.halted:
            break
        if job.state is not JobState.PENDING:
            continue
        full = turn.n_reserved >= turn.depth
        outcome, rule = turn.turn(job, not job.variants and walk.fail_fit.get(job.fkey, INF) <= job.shape.k)
        if rule == A.FREE and not job.variants:
            walk.fail_fit[job.fkey] = min(walk.fail_fit.get(job.fkey, INF), job.shape.k)
        if outcome not in (STARTED, PREEMPTED, HELD) and full:
            walk.budget -= 1
        if strict and outcome == BLOCKED and A.stops_strict_order(job, rule):
            break
    turn.finish()
    return True


class Walk:
    """The walk of the fast pass over the pending queue by sub-queue heads, in global
    queue order.

    Lemmas (free GPUs, victims and quota headroom only shrink during a pass; claims only
    grow; so a job refused at some point stays refused later in the pass):

    * a job of a sub-queue (same shape, filter, class, charges) refused by a rule that
      does not look at its planned run (rules 1-8) proves every later job of its
      sub-queue refused, for starting, preempting and - once the depth is reached -
      reserving: they are not looked at;
    * refused by the claims (rule 9), it proves refused every later job of its
      sub-queue whose planned run is not shorter (a longer run covers more claim
      points): the walk jumps to the next shorter one (``PendingQueue.next_shorter``);
    * a failed placement of ``k`` GPUs for a node filter proves every job of that filter
      asking ``>= k`` refused at rule 5 for the rest of the pass;
    * with no free GPU, no share pending, no preemption possible for any pending job and
      the depth reached, nothing more can happen (the walk stops).

    A walk that has tested ``backfill.max_job_test`` jobs that did nothing once the
    depth is reached stops (``cut``) and asks for a wake-up a second later; the next
    pass, if nothing changed but the time, resumes it where it stopped.
    """

    def __init__(self, turn: Turn, budget: int | None = None, stop_key: tuple | None = None):
        book = self.book = turn.book  # (not the turn: a pass is freed by reference counting, note 059)
        queue = book.queue
        self.heads = list(queue.heads)
        self.prio_top = None  # the highest class pending (worked out when it matters)
        self.cont: list[tuple[tuple, int, int]] = []
        self.fail_fit: dict[int, int] = {}
        self.budget = book.rules.backfill_max_job_test if budget is None else budget
        self.given = self.budget  # over all its segments (``given - budget``: spent)
        self.stop_key = stop_key  # a restored core's walk is cut there (note 085)
        self.hi = 0
        self.cut = False
        #: the walk stopped before every job's turn: nothing could start (no free GPU,
        #: no share pending, no preemption) - jobs after it were not turned
        self.stopped = False
        #: every preemptor takes its turn at its place in the queue, whatever its
        #: sub-queue's earlier jobs proved (its own hold is free for it)
        self.pre = sorted(book.preemptors.values(), key=lambda j: j.key)
        self.pi = 0

    def run(self, turn: Turn) -> None:
        book = self.book
        queue = book.queue
        subs = queue.subs
        heads, cont, fail_fit = self.heads, self.cont, self.fail_fit
        strict = not book.rules.backfill_enabled
        cohorts = bool(book.rules.cohorts)
        within = bool(book.rules.within_team)
        preempting = book.rules.preemption_enabled  # (``Turn.can_preempt`` is False without)
        n_heads = len(heads)
        self.cut = self.stopped = False
        pre = self.pre
        while not turn.halted:
            nxt_key = None
            if cont:
                nxt_key = cont[0][0]
            if self.hi < n_heads and (nxt_key is None or heads[self.hi][0] < nxt_key):
                nxt_key = heads[self.hi][0]
            if self.stop_key is not None and nxt_key is not None and nxt_key >= self.stop_key:
                self.cut = True  # a restored core's walk, up to where the walk was cut (note 085)
                break
            while self.pi < len(pre) and pre[self.pi].state is not JobState.PENDING:
                self.pi += 1
            if self.pi < len(pre) and (nxt_key is None or pre[self.pi].key < nxt_key):
                job = pre[self.pi]
                self.pi += 1
                if job.id not in turn.visited and job.id in book.preemptors:
                    turn.turn(job)
                continue
            if nxt_key is None:
                break
            if cont and cont[0][0] == nxt_key:
                _key, sig, idx = heapq.heappop(cont)
            else:
                sig = heads[self.hi][1]
                self.hi += 1
                idx = 0
            sub = subs[sig]
            job = sub[idx]
            full = turn.n_reserved >= turn.depth
            if (full and book.ledger.free_total == 0 and not book.pending_shares and not cohorts
                    and self.pi >= len(pre)):
                if not ((book.rules.preemption_enabled or within) and book.evictable):
                    self.stopped = True
                    break  # nothing can start, preempt or reserve any more
                if self.prio_top is None:  # (every sub-queue's: a resumed walk's heads are those not reached)
                    self.prio_top = max(sub[0].cls.priority for sub in subs.values() if sub)
                if min(book.evictable) >= self.prio_top:
                    self.stopped = True
                    break
            shape = job.shape
            # (a job of several GPU types may place otherwise on one of them: seed 531297)
            no_room = not job.variants and fail_fit.get(job.fkey, INF) <= shape.k
            if (full and no_room and not strict and not (preempting and turn.can_preempt(job))
                    and job.id not in book.preemptors and not (within and preemption.within_team(book, job))):
                # rule 5 (or earlier) refuses it and its sub-queue: nothing to do, unless within-team (seed 724)
                if within and shape.mode != "share":
                    turn.within_refused.append(job)  # as ``Turn.blocked`` keeps it (``again._within_now``)
                continue
            if full and self.budget <= 0:
                heapq.heappush(cont, (job.key, sig, idx))
                self.cut = True
                break
            outcome, rule = turn.turn(job, no_room)
            if rule == A.FREE and not job.variants:  # one type's failure says nothing of the others (note 038)
                fail_fit[job.fkey] = min(fail_fit.get(job.fkey, INF), shape.k)
            if outcome in (STARTED, PREEMPTED, HELD):
                nxt = idx + 1
            else:
                if full:
                    self.budget -= 1
                if strict and A.stops_strict_order(job, rule):
                    break  # no backfill: nobody passes a blocked job
                if rule not in A.RESERVABLE and not job.variants:
                    continue  # can never fit: the same for its whole sub-queue
                if job.variants or turn.n_reserved < turn.depth:
                    nxt = idx + 1  # the next may take a reservation too, or (typed) place otherwise (note 089)
                elif rule == A.HARD_NOW:
                    continue  # a hard limit now: the same for its whole sub-queue
                elif rule == A.CLAIMS or (preempting and turn.profile and turn.can_preempt(job)):
                    nxt = queue.next_shorter(sig, idx, job.pend_est)  # only a shorter run may do better
                    if nxt is None:
                        continue
                else:
                    continue
            if nxt < len(sub):
                heapq.heappush(cont, (sub[nxt].key, sig, nxt))
        if self.stopped and strict and (turn.first_blocked is None or job.key < turn.first_blocked.key):
            # nothing can act any more, but the strict order's stop is still named: the first job from
            # here refused for capacity, as a full walk finds it (the reasons behind it depend on it)
            for later in queue.iter_from(job.key):
                if turn.first_blocked is not None and turn.first_blocked.key <= later.key:
                    break
                turn.turn(later, True)
        if self.cut:  # positions move when the started jobs leave the queue: keep keys only
            self.cont = [(key, sig, -1) for key, sig, _idx in cont]
        turn.finish()
        turn.sched.resume_at = book.now + 1.0 if self.cut else None  # the rest: a second later

    def resume(self, turn: Turn) -> None:
        """Find the positions of the jobs the walk was about to look at again, and the heads
        of the sub-queues not reached (its starts left the queue: note 085), and go on."""
        queue = self.book.queue
        subs = queue.subs
        self.cont = [(key, sig, bisect_left(queue.keys_of(sig), key)) for key, sig, _i in self.cont
                     if sig in subs]
        heapq.heapify(self.cont)
        self.heads = sorted((subs[sig][0].key, sig) for _key, sig in self.heads[self.hi:] if sig in subs)
        self.hi, self.prio_top, self.stop_key = 0, None, None
        self.budget = self.book.rules.backfill_max_job_test
        self.given += self.budget
        self.run(turn)


"""The scheduling core: events in, decisions out.

``Scheduler.handle(events)`` is the one entry point (dask's ``handle_stimulus``): it
applies the events of one instant in a fixed order (job exits, then hardware and
operator actions, then submissions by job id), then runs the cycle (``core/cycle.py``:
expire, order, holds, admit, preempt, reserve, backfill). It reads no clock, does no
I/O and draws no random numbers: the same events give the same decisions, ties broken by
stable keys (job id, node index).

This class only dispatches: the state and its transitions are ``core/book.py``'s, the one
admission rule ``core/admission.py``'s, the pass ``core/cycle.py``'s (or, with
``reference=True``, ``core/reference.py``'s: the same rules without shortcuts, for the
oracle tests). Design notes 001 and 015.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Iterable
from itertools import groupby

from gpushepherd.core import amend, cycle, estimates, expire, invariants, lifecycle, priority, snapshot, typed
from gpushepherd.core.admission import Admission
from gpushepherd.core.book import Book
from gpushepherd.core.intake import SpecError, event_order, spec_with, validate_spec
from gpushepherd.core.migplan import plan_mig
from gpushepherd.core.profile import Profile
from gpushepherd.core.reference import run_reference
from gpushepherd.core.state import INF, Job
from gpushepherd.core import reasons
from gpushepherd.core.reasons import preempted_reason
from gpushepherd.core.standing import reservations_stand
from gpushepherd.core.stranded import stranded_capacity
from gpushepherd.core.usage import declared_mib, sample_error
from gpushepherd.model.decisions import Decision
from gpushepherd.model.events import (
    Event,
    GpuHealthChanged,
    GpuUnmanaged,
    JobAdopted,
    JobSubmitted,
    JobUpdated,
    MigReconfigured,
    NodeAdded,
    UsageSample,
)
from gpushepherd.model.job import JobSpec, JobState
from gpushepherd.model.reasons import PendingReason
from gpushepherd.model.rules import Rules

__all__ = ["Scheduler", "SpecError", "spec_with", "validate_spec"]

#: the snapshot's keys of the last pass's walk, when its budget shaped it (note 085)
CUT_WALK = ("walk_given", "walk_left", "walk_stop", "walk_acted")
#: a walk rebuilt at a restore stops at its key or its end, not for its budget
UNBOUNDED = 1 << 62


def _tupled(x):
    """A queue key read back from JSON: its lists as the tuples it was made of."""
    return tuple(_tupled(i) for i in x) if isinstance(x, list) else x


class Scheduler:
    """The pure scheduling core (module docstring).

    Attributes:
        rules: the compiled policy.
        book: the state (``core/book.py``); ``jobs``, ``ledger``, ``quota``, ``now`` are
            its attributes.
        reference: run the reference pass instead of the fast one.
    """

    #: the admission rule's class (a baseline may place shares its own way)
    admission_class = Admission

    def __init__(self, rules: Rules, reference: bool = False):
        self.rules = rules
        self.book = Book(rules)
        self.admission = self.admission_class(self.book)
        self.reference = self.book.reference = reference
        self.pass_no = 0
        self.last_turn: cycle.Turn | None = None
        self.last_pass_t = float("-inf")
        self._new: list[Job] = []
        self._prefix_profiles: dict[int, Profile] = {}
        self._estimates: dict | None = None
        #: when a walk cut short by its budget goes on (``None``: none was)
        self.resume_at: float | None = None

    # ------------------------------------------------------------ views
    @property
    def jobs(self) -> dict[str, Job]:
        return self.book.jobs

    @property
    def ledger(self):
        return self.book.ledger

    @property
    def quota(self):
        return self.book.quota

    @property
    def usage(self):
        return self.book.usage

    @property
    def predictor(self):
        return self.book.predictor

    @property
    def now(self) -> float:
        return self.book.now

    # -------------------------------------------------------------- API
    def handle(self, events: Event | Iterable[Event]) -> list[Decision]:
        """Apply events and schedule; returns the decisions, in the order taken.

        Events may span several instants; each instant gets its own pass.

        Raises:
            ValueError: an event earlier than one already handled, or a submission the
                policy rejects (``SpecError``) - nothing of that instant is applied when
                a submission is invalid.
        """
        if isinstance(events, Event):
            events = [events]
        book = self.book
        out: list[Decision] = []
        if not isinstance(events, list):
            events = list(events)
        # one event (the simulator's usual instant) needs no order: its key's ``repr`` cost more than the rest
        instants = [(events[0].t, events)] if len(events) == 1 else groupby(sorted(events, key=event_order),
                                                                            key=lambda e: e.t)
        for t, batch_iter in instants:
            batch = list(batch_iter)
            if t < book.now:
                raise ValueError(f"event at t={t} is earlier than the scheduler's time {book.now}")
            for e in batch:
                self._validate(e)
            book.now = t
            self._forget()
            tightened = expire.windows_at(book, t)
            priority.maybe_recalc(book, t)
            for e in batch:
                book.event_no += 1
                lifecycle.apply(book, e, out, self._new)
            expire.expire(book, out)
            if tightened:
                expire.close_windows(book, tightened, out)
            self._schedule(out)
            if self.rules.mig_reconfigure and book.pending_shares:
                plan_mig(book, self.admission, out)
        return out

    def _validate(self, e: Event) -> None:
        book = self.book
        if isinstance(e, (NodeAdded, GpuHealthChanged, MigReconfigured, GpuUnmanaged)):
            lifecycle.validate_hardware(book, e)
        if isinstance(e, UsageSample):
            bad = sample_error(e.job_id, e.gpu_util_pct, e.mem_used_mib)
            if bad is not None:
                raise ValueError(bad)
        if isinstance(e, JobUpdated):
            amend.check(book, e)
        if isinstance(e, (JobSubmitted, JobAdopted)):
            if e.spec is None:
                raise SpecError("JobSubmitted without a spec")
            validate_spec(self.rules, e.spec)
            if e.spec.id in book.jobs:
                raise SpecError(f"job {e.spec.id!r}: id: is not allowed: an id not used before")

    def check_update(self, e: JobUpdated) -> None:
        """Whether ``handle`` would take update ``e`` now (``core/amend.py``, note 039).

        Raises:
            SpecError: a change the rules refuse, naming the job, the field, the value and
                what is allowed (above the class's max runtime, a raise of the time limit
                or a lower nice not asked by an admin, a value out of range).
        """
        amend.check(self.book, e)

    def _schedule(self, out: list[Decision]) -> None:
        """Step 2 of the cycle: a pass (``_pass``), then - while the last pass began a
        preemption - another at the same instant. Signalled victims leave at ``now +
        grace``, which moves the profile: the preemptor may now start on GPUs the claims
        refused it before, a reservation may move. The pass after sees that, so the
        decisions of an instant are those of a full pass on its final state (the oracle's
        incremental == full pass == ``restore``). Likewise when a job of a cohort member
        made it borrow after a job that could reclaim from it found no victims
        (``book.repass``), and when a job started after a reservation made another
        placement of it the best (``standing.reservations_stand``). Each repeat needs
        victims not signalled before or a job not started before, so it ends."""
        book = self.book
        book.repass = False
        self._pass(out)
        while book.repass or (self.last_turn is not None and not reservations_stand(self.last_turn)):
            book.repass = False
            book.dirty = True
            self._pass(out)

    def _pass(self, out: list[Decision]) -> None:
        """Run a pass when something may have changed: an event other than a bare tick,
        a victim coming of age, or a running job outliving its planned end (the profile
        moved). Otherwise the last pass's decisions stand: the same state gives the same
        pass."""
        book = self.book
        new, self._new = self._new, []
        if not book.queue:
            book.dirty = False
            self.last_pass_t = book.now
            self.last_turn = None
            return
        wakeups = book.wakeups
        while wakeups and wakeups[0] <= book.now:
            heapq.heappop(wakeups)
            book.dirty = True
        if not book.dirty:
            ends = book.ends
            i = bisect_right(ends, (self.last_pass_t, INF, ""))
            moved = i < len(ends) and ends[i][0] <= book.now  # a job outlived its planned end
            if i and book.now > self.last_pass_t and self.last_turn is not None and self.last_turn.n_reserved:
                # one had before the last pass: it is taken to end now, so the reservations
                # move with the time (seed 194149: a full pass later planned another start)
                moved = True
            if new and not moved and not self.reference and self.last_turn is not None:
                if cycle.continue_fast(self.last_turn, new, out):
                    self.pass_no += 1
                    self.last_pass_t = book.now
                    return
        if not book.dirty and not new:
            if not moved:
                turn = self.last_turn
                if (self.resume_at is not None and book.now >= self.resume_at and turn is not None
                        and turn.walk is not None and turn.walk.cut):
                    self.pass_no += 1  # the same pass, gone on with: reasons are worked out again
                    self.last_pass_t = book.now
                    cycle.resume_fast(turn, out)
                return  # nothing changed: the last pass (and its reservations) stands
        book.dirty = False
        self.last_pass_t = book.now
        self.resume_at = None
        self.pass_no += 1
        self.last_turn = run_reference(self, out) if self.reference else cycle.run_fast(self, out)

    def _forget(self) -> None:
        """Drop what the queries worked out from the state (estimates, the claims that
        bind a job at each place in the queue): an instant's events and pass change the
        state, however its pass runs - in full, as ``continue_fast`` over the new jobs
        only, as ``resume_fast``, or not at all (oracle seed 17125: a profile built before
        a ``continue_fast`` start named a job admitted that its pass had refused)."""
        self._estimates = None
        self._prefix_profiles = {}

    def wake_at(self, t: float) -> None:
        """Ask for a pass at ``t`` (a victim comes of age, a pass cut by its budget)."""
        book = self.book
        if book.now < t < INF and t not in book.wakeups:
            heapq.heappush(book.wakeups, t)

    def next_wakeup(self) -> float | None:
        """The earliest time the core needs a ``Tick``: a time limit, an idle deadline, a
        running job reaching the minimum runtime that lets a blocked job preempt it, a
        priority recalculation or a window boundary that can change something. ``None``:
        none."""
        book = self.book
        t_limit = expire.next_timer(book)
        while book.wakeups and book.wakeups[0] <= book.now:
            heapq.heappop(book.wakeups)
        t_wake = book.wakeups[0] if book.wakeups and book.queue else None
        if (self.rules.priority.dynamic and book.queue and book.next_recalc > book.now
                and priority.recalc_matters(book)):
            t_wake = book.next_recalc if t_wake is None else min(t_wake, book.next_recalc)
        t_window = None
        if book.quota.windowed and expire.window_matters(book, self.admission):
            t_window = self.rules.clock.next_boundary(self.rules.window_boundaries(), book.now)
        if self.resume_at is not None and self.resume_at > book.now and book.queue:
            t_wake = self.resume_at if t_wake is None else min(t_wake, self.resume_at)
        times = [t for t in (t_limit, t_wake, t_window) if t is not None]
        return min(times) if times else None

    # ------------------------------------------------------------ queries
    def pending_jobs(self) -> list[Job]:
        """Pending jobs in queue order (a copy)."""
        return list(self.book.queue)

    def running_jobs(self) -> list[Job]:
        """Jobs holding GPUs (running, preempting, stopping), in submission order."""
        return sorted(self.book.running.values(), key=lambda j: j.seq)

    def holding(self):
        """Jobs holding GPUs, in no particular order (callers sort by their own keys)."""
        return self.book.running.values()

    def ends_sorted(self) -> list[tuple[float, int, str]]:
        """``(planned end, seq, job id)`` of jobs holding GPUs, earliest end first."""
        return self.book.ends

    def profile_for(self, job: Job) -> Profile:
        """The claims that bind ``job`` now: every hold, and the reservations of the last
        pass made before its turn (of jobs ahead of it), on the current state."""
        turn = self.last_turn
        if turn is None:
            return Profile(self.book)
        turn.materialize()
        claims = turn.profile.claims
        n = sum(1 for c in claims if c.hold or c.key < job.key)
        found = self._prefix_profiles.get(n)
        if found is None:
            found = Profile(self.book)
            for c in claims:
                if c.hold:
                    found.add_hold(self.book.jobs[c.job_id])
            for c in claims:
                if not c.hold and c.key < job.key:
                    owner = self.book.jobs[c.job_id]
                    with typed.turned(owner):  # the GPU type it was reserved on (note 038)
                        found.add_reservation(owner, c.start, list(c.gpus.items()), c.basis, lend=c.lend)
            self._prefix_profiles[n] = found
        return found

    def pending_reason(self, job_id: str) -> PendingReason | None:
        """Why a pending job waits now (``None`` if it is not pending): the first rule of
        the admission rule that refuses it (``core/admission.py``)."""
        job = self.book.jobs.get(job_id)
        if job is None or job.state is not JobState.PENDING:
            return None
        if job.reason_pass != self.pass_no:
            job.reason = reasons.pending_reason(self, job)
            job.reason_pass = self.pass_no
        return job.reason

    def state_reason(self, job_id: str) -> str | None:
        """Why a job is in its state now, as text: a pending job's reason
        (``pending_reason``), a preempted job's in its grace period
        (``reasons.preempted_reason``: ``Preempted(by job 7, class production-inference)``),
        a rejected job's; ``None`` otherwise."""
        job = self.book.jobs.get(job_id)
        if job is None:
            return None
        if job.state is JobState.PENDING:
            return str(self.pending_reason(job_id))
        if job.state is JobState.REJECTED:
            return str(job.reason)
        return preempted_reason(self.book, job)

    def estimated_starts(self) -> dict[str, estimates.Estimate]:
        """Every pending job's planned start (``core/estimates.py``), by job id."""
        if self._estimates is None:
            self._estimates = estimates.plan_all(self)
        return self._estimates

    def estimated_start(self, job_id: str) -> float | None:
        """A pending job's planned start in seconds (``None``: none can be planned)."""
        est = self.estimated_starts().get(job_id)
        return None if est is None else est.t

    @property
    def reservations(self) -> list:
        """The claims (holds, reservations) of the last pass."""
        if self.last_turn is None:
            return []
        self.last_turn.materialize()
        return list(self.last_turn.profile.claims)

    def nodes_for(self, job: Job) -> frozenset[int]:
        return self.book.nodes_for(job)

    def groups_for(self, job: Job) -> list[int]:
        return self.book.groups_for(job)

    def avoided_nodes(self, job: Job) -> frozenset[int]:
        return self.book.avoided_nodes(job)

    def inventory_misfit(self, job: Job) -> str | None:
        """Why no node the scheduler knows could ever hold ``job`` (``None``: one could)."""
        return lifecycle.inventory_misfit(self.book, job)

    def spec_misfit(self, spec: JobSpec) -> str | None:
        """The same of a spec not submitted (a job kept from the core, an array's tasks):
        what the core would reject it with at submit - whole-GPU counts, shares, MIG and
        a gang's layout (``lifecycle.spec_misfit``); ``None``: it would be queued.

        Raises:
            KeyError: ``spec``'s class is not in the policy (``validate_spec`` first)."""
        return lifecycle.spec_misfit(self.book, self.rules.classes[spec.workload_class], spec)

    def stranded_capacity(self) -> dict:
        """Free GPU capacity and the part no pending job could use now, by the constraint
        that strands it (``gpushepherd.core.stranded``)."""
        return stranded_capacity(self)

    def unmanaged_gpus(self) -> list[tuple[str, int]]:
        """``(node, GPU index)`` of the live GPUs reported unmanaged."""
        return lifecycle.unmanaged_gpus(self.book)

    def fair_share_factor(self, team: str, user: str = "") -> float:
        """Slurm's classic ``2^(-U/S)`` now (``core/priority.py``)."""
        return priority.fair_share_factor(self.book, team, user)

    def priority_factors(self, job_id: str) -> dict[str, float]:
        """A job's priority, factor by factor, weighted (what Slurm's ``sprio`` shows)."""
        job = self.book.jobs[job_id]
        return priority.factors(self.book, job.spec, job.cls, job.estimate_s)

    def deadline_at_risk(self, job_id: str) -> list[tuple[float, str, float]]:
        """``(time, "submit" | "start", earliest end)`` each time the job was found unable
        to meet its deadline (empty: never, or no deadline)."""
        return list(self.book.jobs[job_id].deadline_flags)

    def usage_of(self, job_id: str) -> dict | None:
        """What the GPU samples of a job said (``None``: unknown job); keys as note 009:
        ``samples``, ``last_util_pct``, ``last_sample_t``, ``idle_since``,
        ``idle_stop_at``, ``run_peak_mib``, ``peak_mib``, ``declared_mib``, ``over``,
        ``over_at``, ``over_runs``, ``stop_reason``."""
        from gpushepherd.core.usage import UsageTrack

        job = self.book.jobs.get(job_id)
        if job is None:
            return None
        tr = self.book.tracks.get(job_id) or UsageTrack()
        if tr.run != job.runs and job.state.holds_gpus:  # a new run without samples yet
            tr = UsageTrack(run=job.runs, peak_mib=tr.peak_mib, over_runs=tr.over_runs)
        rule = job.cls.idle_stop
        since = tr.idle_since if job.state is JobState.RUNNING else None
        return {
            "samples": tr.samples, "last_util_pct": tr.last_util, "last_sample_t": tr.last_t,
            "idle_since": since,
            "idle_stop_at": since + rule.after_s if since is not None and rule is not None else None,
            "run_peak_mib": tr.run_peak_mib, "peak_mib": tr.peak_mib,
            "declared_mib": declared_mib(job.spec), "over": tr.over_at is not None,
            "over_at": tr.over_at, "over_runs": tr.over_runs, "stop_reason": job.stop_reason,
        }

    # --------------------------------------------------- state, invariants
    def snapshot(self) -> dict:
        """The scheduler's state as plain data (JSON-serialisable; ``core/snapshot.py``);
        after a pass its budget cut short, when it goes on (``resume_at``, seconds); and
        while the last pass stands, its walk where a budget shaped it (note 085): the
        budget given (``walk_given``, jobs) and left (``walk_left``), and where a cut walk
        goes on (``walk_stop``, the next job's queue key)."""
        snap = snapshot.snapshot(self.book)
        turn = self.last_turn
        walk = turn.walk if turn is not None else None
        if walk is None:
            return snap
        if walk.cut and self.resume_at is not None:
            snap["resume_at"] = self.resume_at
        if not self.book.dirty and (walk.cut or walk.given > self.rules.backfill_max_job_test):
            # the last pass stands (nothing changed since): its walk is rebuilt at a restore
            snap["walk_given"], snap["walk_left"] = walk.given, walk.budget
            snap["walk_acted"] = turn.acted_after_reserve  # (the rebuilt walk decides nothing)
            if walk.cut:  # the key of the next job it would turn
                snap["walk_stop"] = list(min([k for k, _s, _i in walk.cont] + [k for k, _s in walk.heads[walk.hi:]]))
        return snap

    @classmethod
    def restore(cls, rules: Rules, snap: dict, reference: bool = False, new_rules: bool = False) -> "Scheduler":
        """Rebuild a scheduler from ``snapshot()`` data under ``rules``. Its first call runs
        a full pass, unless the snapshot kept the last pass's walk (its budget shaped it):
        then the walk is rebuilt and the core goes on as the uninterrupted one would (note
        085) - not with ``new_rules`` (``rules`` are not those of the snapshot's core: a
        policy change), nor on a reference core.

        Raises:
            ValueError: the snapshot's allocations collide (a GPU given twice) or name GPUs
                that do not exist.
        """
        sched = cls(rules, reference=reference)
        snapshot.restore_into(sched, snap)
        if snap.get("walk_given") is not None and not (reference or new_rules):
            # the last pass's walk again, up to the job it would turn next when it was cut
            # (else to its end): it decides nothing (the state holds its decisions), and
            # leaves its claims, its budget for the next submissions (continue_fast) and
            # a cut walk to go on at resume_at, as the uninterrupted core's (note 085)
            out: list[Decision] = []
            book = sched.book
            book.dirty = False
            sched.last_pass_t = book.now
            sched.pass_no += 1
            stop = _tupled(snap["walk_stop"]) if snap.get("walk_stop") is not None else None
            sched.last_turn = cycle.run_fast(sched, out, UNBOUNDED, stop)
            if out:  # not that walk after all: the first call makes a full pass, as before
                return cls.restore(rules, {k: v for k, v in snap.items() if k not in CUT_WALK}, reference)
            walk = sched.last_turn.walk
            walk.given, walk.budget = int(snap["walk_given"]), int(snap["walk_left"])
            sched.last_turn.acted_after_reserve = bool(snap.get("walk_acted"))
        if snap.get("resume_at") is not None and not (reference or new_rules):
            sched.resume_at = float(snap["resume_at"])
        sched.check_invariants()
        return sched

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` when the state is inconsistent (``core/invariants.py``)."""
        invariants.check_invariants(self.book)

"""The scheduling core: events in, decisions out.

``Scheduler.handle(events)`` is the one entry point (dask's ``handle_stimulus``): it
applies the events of one instant in a fixed order (job exits, then hardware and
operator actions, then submissions by job id), expires time limits and runs one
scheduling pass. It reads no clock, does no I/O and draws no random numbers: the same
events give the same decisions, ties broken by stable keys (job id, node index).

The pass, least disruptive first (architecture section 2; Kueue's ``schedule()``):

1. expire   - jobs past their time limit are stopped;
2. order    - pending jobs by class priority, then submit time, then job id;
3. admit    - hard limits: a job that can never fit, quotas (team, user, class);
4. place    - whole-GPU placement by bin-packing, gangs all or nothing;
5. reserve  - the top blocked jobs get a reservation from running jobs' estimates;
6. backfill - later jobs start only if they delay no reservation;
7. preempt  - a blocked job may evict lower-priority preemptible work; the freed GPUs
              are held for it until its victims have exited.

Every pending job carries the reason of the stage that stopped it.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from collections.abc import Iterable
from dataclasses import asdict, replace
from itertools import groupby

from gpushepherd.core import backfill
from gpushepherd.core.fairshare import UsageBook, factor
from gpushepherd.core.filters import describe, inventory_misfit, job_filter, node_ok, share_fits_card, whole_gpus
from gpushepherd.core.ledger import MIG, SHARED, Ledger, bits
from gpushepherd.core.placement import Counts, Shape, members_of, pick_gpus, place_counts, place_live
from gpushepherd.core.predict import RuntimePredictor
from gpushepherd.core.preemption import lower_jobs_would_make_room, reclaim_victims, victim_order_key, victims_for
from gpushepherd.core.queue import PendingQueue, estimate_band
from gpushepherd.core.quota import QuotaBook
from gpushepherd.core.state import INF, Job, Transition
from gpushepherd.core.stranded import stranded_capacity
from gpushepherd.core.usage import SHARED_MEMORY_KINDS, UsageTrack, declared_mib, sample_error
from gpushepherd.model.cluster import Node
from gpushepherd.model.decisions import Decision, Preempt, ReconfigureMig, Reject, Start, Stop
from gpushepherd.model.events import (
    Event,
    GpuHealthChanged,
    GpuUnmanaged,
    JobAdopted,
    JobCancelled,
    JobFinished,
    JobRequeueRequested,
    JobSubmitted,
    MigReconfigured,
    NodeAdded,
    NodeLost,
    Tick,
    UsageSample,
)
from gpushepherd.model.job import GPU_UNITS, SHARE_KINDS, ExitStatus, GpuShare, JobSpec, JobState, natural_key
from gpushepherd.model.mig import (
    MIG_MODELS,
    MigError,
    MigInstance,
    layout_from_names,
    mig_model,
    profile as mig_profile,
    profiles_for,
    validate_layout,
)
from gpushepherd.model.placement import Placement
from gpushepherd.model.reasons import PendingReason, ReasonCode
from gpushepherd.model.rules import Rules

R = ReasonCode


class SpecError(ValueError):
    """A job spec the policy cannot take; ``str()`` names the field, value and what is allowed."""


def validate_spec(rules: Rules, spec: JobSpec) -> None:
    """Check a job spec against the policy before it is submitted.

    Raises:
        SpecError: unknown class or team, non-positive GPUs, a pod size that does not
            divide the GPUs, negative times, a time limit above the class's max runtime.
    """
    where = f"job {spec.id!r}"
    if not spec.id:
        raise SpecError("job id: '' is not allowed: a non-empty id")
    if spec.workload_class not in rules.classes:
        raise SpecError(f"{where}: class: {spec.workload_class!r} is not allowed: one of {', '.join(sorted(rules.classes))}")
    if rules.teams and spec.team not in rules.teams:
        raise SpecError(f"{where}: team: {spec.team!r} is not allowed: one of {', '.join(sorted(rules.teams))}")
    if not isinstance(spec.gpus, int) or spec.gpus < 1:
        raise SpecError(f"{where}: gpus: {spec.gpus!r} is not allowed: an integer >= 1")
    if spec.gpus_per_pod is not None and (spec.gpus_per_pod < 1 or spec.gpus % spec.gpus_per_pod):
        raise SpecError(f"{where}: gpus_per_pod: {spec.gpus_per_pod!r} is not allowed: a divisor of gpus ({spec.gpus})")
    for name in ("time_limit_s", "runtime_estimate_s"):
        value = getattr(spec, name)
        if value is not None and not value > 0:
            raise SpecError(f"{where}: {name}: {value!r} is not allowed: seconds > 0")
    if spec.gpu_mem_mib < 0:
        raise SpecError(f"{where}: gpu_mem_mib: {spec.gpu_mem_mib!r} is not allowed: MiB >= 0")
    if spec.submit_time != spec.submit_time or spec.submit_time in (INF, -INF):
        raise SpecError(f"{where}: submit_time: {spec.submit_time!r} is not allowed: a finite number of seconds")
    if spec.deadline is not None and not (spec.deadline == spec.deadline and spec.deadline > spec.submit_time
                                          and spec.deadline != INF):
        raise SpecError(f"{where}: deadline: {spec.deadline!r} is not allowed: a finite time after submit_time "
                        f"({spec.submit_time})")
    cls = rules.classes[spec.workload_class]
    _validate_share(spec, cls, where)
    if spec.preemptible and cls.name == "production-inference":
        raise SpecError(f"{where}: preemptible: True is not allowed: production inference is never preempted "
                        "(use another class for work that may be)")
    if cls.max_runtime_s is not None and spec.time_limit_s is not None and spec.time_limit_s > cls.max_runtime_s:
        raise SpecError(f"{where}: time_limit_s: {spec.time_limit_s!r} is not allowed: at most the max runtime of "
                        f"class {cls.name} ({cls.max_runtime_s} s)")


#: every MIG profile name of every GPU model we know, sorted
_MIG_NAMES = sorted({name for profiles in MIG_MODELS.values() for name in profiles},
                    key=lambda n: (int(n.split("g.")[0]), n))


def _validate_share(spec: JobSpec, cls, where: str) -> None:
    share = spec.share
    if share is not None and not isinstance(share, GpuShare):
        raise SpecError(f"{where}: share: {share!r} is not allowed: a GpuShare or None")
    mode = share.kind if share is not None else "whole"
    if cls.sharing is not None and mode not in cls.sharing:
        raise SpecError(f"{where}: sharing: {mode!r} is not allowed for class {cls.name}: one of "
                        f"{', '.join(cls.sharing)}")
    if share is None:
        return
    if share.kind not in SHARE_KINDS:
        raise SpecError(f"{where}: share.kind: {share.kind!r} is not allowed: one of {', '.join(SHARE_KINDS)}")
    if spec.gpus != 1 or spec.gpus_per_pod:
        raise SpecError(f"{where}: gpus: {spec.gpus!r} is not allowed with a {share.kind} share: 1 (a share is "
                        "part of one GPU)")
    for name in ("milli", "mem_mib", "slots"):
        value = getattr(share, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise SpecError(f"{where}: share.{name}: {value!r} is not allowed: an integer >= 0")
    if share.kind == "fraction" and not (0 < share.milli <= 1000 or (share.milli == 0 and share.mem_mib > 0)):
        raise SpecError(f"{where}: gpu_fraction: {share.milli / 1000:g} is not allowed: 0.001 .. 1 (or 0 with "
                        "gpu_mem_mib > 0)")
    if share.kind == "time_slice" and (share.slots < 1 or share.mem_mib < 1):
        raise SpecError(f"{where}: time_slice: replicas {share.slots}, gpu_mem_mib {share.mem_mib} is not allowed: "
                        "at least 1 replica and the GPU memory it uses declared (time-sliced jobs share memory "
                        "without isolation)")
    if share.kind == "mps" and (share.slots < 1 or not 0 < share.milli <= 1000):
        raise SpecError(f"{where}: mps: {share.slots} clients at {share.milli / 10:g}% SM is not allowed: at least "
                        "1 client and an SM percentage in (0, 100]")
    if share.kind == "mig" and share.profile not in _MIG_NAMES:
        raise SpecError(f"{where}: mig_profile: {share.profile!r} is not allowed: a MIG profile as NVIDIA names it "
                        f"(lower case), one of {', '.join(_MIG_NAMES)}")


#: within one instant's hardware and operator events: a node lost, then a node added
#: (it may come back), then GPU health (of the node as it is now), then operator actions
#: (a GPU's foreign processes after its health; usage samples of the jobs on the
#: hardware as it is then)
_SUBRANK = {"NodeLost": 0, "NodeAdded": 1, "GpuHealthChanged": 2, "GpuUnmanaged": 3, "MigReconfigured": 4,
            "UsageSample": 5, "JobAdopted": 6, "JobCancelled": 7, "JobRequeueRequested": 8}


def _event_order(e: Event) -> tuple:
    """A total order of the events of one instant that does not depend on the order
    they were given in (ties end on the event's full text; a GPU reported both healthy
    and unhealthy at once ends unhealthy)."""
    if isinstance(e, JobSubmitted):
        return (e.t, e.rank, 0, natural_key(e.spec.id if e.spec else ""), repr(e))
    job = getattr(e, "job_id", "") or ""
    if isinstance(e, JobAdopted) and e.spec is not None:
        job = e.spec.id
    node = getattr(e, "node", "")
    node = node.name if isinstance(node, Node) else node
    healthy = getattr(e, "healthy", False) or not getattr(e, "unmanaged", True)
    return (e.t, e.rank, _SUBRANK.get(type(e).__name__, 9), node or "", getattr(e, "gpu", 0), natural_key(job),
            not healthy, repr(e))


_GO = object()  # the sub-queue's next job may do better
_DEAD = object()  # no job of this sub-queue can start in this pass
_SHORTER = object()  # only a job short enough to end before the reservations can
_BREAK = object()  # no job at all can start in this pass


class _Pass:
    """What one pass remembers: reservations, and memos of what failed (free GPUs only
    shrink during a pass, so a failure for ``k`` GPUs holds for more)."""

    __slots__ = ("sched", "res", "depth", "n_reserved", "budget", "minp", "fail_fit", "fail_around",
                 "fail_preempt", "started", "deferred")

    def __init__(self, sched: "Scheduler"):
        rules = sched.rules
        self.sched = sched
        self.res = sched.reservations
        self.depth = rules.backfill_reservations if rules.backfill_enabled else 0
        self.n_reserved = sum(1 for r in self.res if not r.hold)
        self.budget = rules.backfill_max_job_test
        self.minp = min(sched._preemptible, default=None) if rules.preemption_enabled else None
        self.fail_fit: dict[tuple, int] = {}
        self.fail_around: dict[tuple, int] = {}
        self.fail_preempt: dict[tuple, int] = {}
        self.started: list[Job] = []
        self.deferred: list[Job] = []  # blocked jobs whose reservation is not computed yet

    def took_gpus(self) -> None:
        sched = self.sched
        if sched.rules.preemption_enabled:
            self.minp = min(sched._preemptible, default=None)

    def short_limit(self) -> float:
        """The longest remaining estimate that ends before every reservation."""
        if not self.res:
            return INF
        return min(r.start for r in self.res) - self.sched.now

    def materialize(self) -> None:
        """Compute the deferred reservations. Called before anything in the pass could
        use them or change the state they are computed from, so they come out exactly
        as if computed when their job blocked."""
        if self.deferred:
            sched = self.sched
            for job in self.deferred:
                r = backfill.reserve_for(sched, job, sched.now, self.res)
                if r is not None:
                    self.res.append(r)
            self.deferred.clear()

    def finish(self) -> None:
        self.sched._deferred = list(self.deferred)  # computed when asked for, if ever
        for job in self.started:
            self.sched._dequeue(job)


class Scheduler:
    """The pure scheduling core. See the module docstring for the cycle.

    Attributes:
        rules: the compiled policy.
        ledger: the allocation ledger (who holds which GPU).
        quota: usage of every policy limit.
        jobs: every job ever submitted, by id.
        now: the time of the last handled event (seconds).
        reservations: the reservations of the last pass.
    """

    def __init__(self, rules: Rules):
        self.rules = rules
        self.ledger = Ledger(rules.nodes)
        self.quota = QuotaBook(rules)
        self.jobs: dict[str, Job] = {}
        self.now = float("-inf")
        self.reservations: list[backfill.Reservation] = []
        self._deferred: list[Job] = []  # blocked jobs of the last pass whose reservation waits to be computed
        self._queue = PendingQueue()
        self._running: dict[str, Job] = {}
        self._ends: list[tuple[float, int, str]] = []
        self._timers: list[tuple[float, int, int, str]] = []
        self._groups_cache: dict[tuple, list[int]] = {}
        self._nodeset_cache: dict[tuple, frozenset[int]] = {}
        self._fkey_ids: dict[tuple, int] = {}
        self._cap_cache: dict[int, bool] = {}  # (filter key, GPUs) -> can never fit the healthy nodes
        self._wakeups: list[float] = []  # times a failed victim search may succeed (minimum runtime)
        self._sig_ids: dict[tuple, int] = {}  # signature -> small int
        self._preemptors: dict[str, Job] = {}  # pending jobs whose victims are still exiting
        self._max_node_cache: dict[tuple, int] = {}
        self._preemptible: dict[int, dict[str, Job]] = {}  # class priority -> RUNNING preemptible jobs
        self._victim_memo: dict[tuple, tuple[int, float]] = {}  # failed victim searches
        self._room_memo: dict[tuple, tuple[int, bool]] = {}
        self._running_prio: dict[int, int] = {}  # class priority -> RUNNING jobs
        #: class priorities ascending; per node index and priority p (by position):
        #: GPUs held by RUNNING jobs of a lower class, all / only those that may be victims
        self._prios = sorted({c.priority for c in rules.classes.values()})
        self._prio_pos = {p: i for i, p in enumerate(self._prios)}
        self._lower_all: list[list[int]] = [[0] * len(self._prios) for _ in self.ledger.slots]
        self._lower_vic: list[list[int]] = [[0] * len(self._prios) for _ in self.ledger.slots]
        #: per priority position: nodes that evicting every lower job (that may be a
        #: victim / at all) would leave whole; kept from the ledger's change log
        self._mk_pos = 0
        self._mk_count = ([0] * len(self._prios), [0] * len(self._prios))
        self._mk_flags: list[list[list[bool]]] = []
        self._uniform: int | None = None
        # multifactor priority and fair-share (Slurm's priority/multifactor)
        self.usage = UsageBook(rules.priority.half_life_s, GPU_UNITS)
        self._max_prio = max((c.priority for c in rules.classes.values()), default=1) or 1
        self._recalc_t = float("-inf")  # when scores were last recomputed
        self._last_submit = float("-inf")  # the latest submit time seen
        self._next_recalc = float("-inf")
        self._teams_seen: set[str] = set(rules.teams)
        self._users_seen: dict[str, set[str]] = {}
        self._class_gpus: dict[str, int] = {}  # class -> GPUs held
        self._cohort_cache: dict[tuple, tuple | None] = {}
        pr = rules.prediction
        self.predictor = RuntimePredictor(pr.quantile, pr.history, pr.min_jobs) if pr.enabled else None
        self._seq = 0
        self._event_no = 0
        self._pass = 0
        self._full = True  # something other than a submission changed since the last pass
        self._new: list[Job] = []
        self._first_blocked: tuple | None = None
        self._pending_shares = 0  # pending jobs that want a share of a GPU
        self._misfit_cache: dict[tuple, str | None] = {}  # the inventory's verdict per job shape (nodes only grow)
        #: per node index: class -> jobs of it holding GPUs there (class anti-affinity)
        self._node_classes: list[dict[str, int]] = [{} for _ in self.ledger.slots]
        self._anti = any(c.avoid for c in rules.classes.values())
        #: (node index, GPU) -> the layout ((start, profile), ...) a reconfiguration is applying
        self._mig_plans: dict[tuple[int, int], tuple[tuple[int, str], ...]] = {}
        #: GPU usage samples per job (note 009); idle deadlines ``(deadline, seq, run,
        #: job id, idle_since)`` (stale entries dropped when seen); memory stops due now
        self._tracks: dict[str, UsageTrack] = {}
        self._idle_timers: list[tuple[float, int, int, str, float]] = []
        self._mem_stops: list[Job] = []
        self._any_unmanaged = False  # some GPU may be unmanaged (exact after each unmanaged report)

    # ------------------------------------------------------------------ API
    def handle(self, events: Event | Iterable[Event]) -> list[Decision]:
        """Apply events and schedule; returns the decisions, in the order taken.

        Events may span several instants; each instant gets its own pass.

        Raises:
            ValueError: an event earlier than one already handled, or a submission
                the policy rejects (``SpecError``) - nothing of that instant is applied
                when a submission is invalid.
        """
        if isinstance(events, Event):
            events = [events]
        ordered = sorted(events, key=_event_order)
        out: list[Decision] = []
        for t, batch_iter in groupby(ordered, key=lambda e: e.t):
            batch = list(batch_iter)
            if t < self.now:
                raise ValueError(f"event at t={t} is earlier than the scheduler's time {self.now}")
            for e in batch:
                if isinstance(e, (NodeAdded, GpuHealthChanged, MigReconfigured, GpuUnmanaged)):
                    self._validate_hardware(e)
                if isinstance(e, UsageSample):
                    bad = sample_error(e.job_id, e.gpu_util_pct, e.mem_used_mib)
                    if bad is not None:
                        raise ValueError(bad)
                if isinstance(e, (JobSubmitted, JobAdopted)):
                    if e.spec is None:
                        raise SpecError("JobSubmitted without a spec")
                    validate_spec(self.rules, e.spec)
                    if e.spec.id in self.jobs:
                        raise SpecError(f"job {e.spec.id!r}: id: is not allowed: an id not used before")
            self.now = t
            tightened = self._windows_at(t)
            self._maybe_recalc(t)
            for e in batch:
                self._event_no += 1
                self._apply(e, out)
            self._expire(out)
            if tightened:
                self._close_windows(tightened, out)
            self._schedule(out)
            if self.rules.mig_reconfigure and self._pending_shares:
                self._plan_mig(out)
        return out

    def next_wakeup(self) -> float | None:
        """The earliest time the core needs a ``Tick``: a time limit, an idle deadline
        (``idle_since + after_s``), or a running job reaching the minimum runtime that
        lets a blocked job preempt it. ``None``: none."""
        t_limit = None
        while self._timers:
            t, _seq, run, job_id = self._timers[0]
            job = self.jobs[job_id]
            if job.state is JobState.RUNNING and job.runs == run:
                t_limit = t
                break
            heapq.heappop(self._timers)
        while self._idle_timers:
            entry = self._idle_timers[0]
            if self._idle_entry_live(entry):
                t_limit = entry[0] if t_limit is None else min(t_limit, entry[0])
                break
            heapq.heappop(self._idle_timers)
        while self._wakeups and self._wakeups[0] <= self.now:
            heapq.heappop(self._wakeups)
        t_wake = self._wakeups[0] if self._wakeups and self._queue else None
        if self.rules.priority.dynamic and self._queue and self._next_recalc > self.now and self._recalc_matters():
            t_wake = self._next_recalc if t_wake is None else min(t_wake, self._next_recalc)
        t_window = None
        if self.quota.windowed and self._window_matters():
            t_window = self.rules.clock.next_boundary(self.rules.window_boundaries(), self.now)
        times = [t for t in (t_limit, t_wake, t_window) if t is not None]
        return min(times) if times else None

    def _recalc_matters(self) -> bool:
        """Whether a priority recalculation can reorder the queue: usage changes only
        while GPUs are held (idle decay scales every entity alike, so shares keep their
        ratios), and age grows only until ``max_age_s``."""
        pr = self.rules.priority
        if pr.fair_share_weight and self._running:
            return True
        # age: some pending job may still be below max_age_s (the newest submission is
        # a cheap upper bound; a spare recalculation is harmless)
        return bool(pr.age_weight) and self._last_submit > self._recalc_t - pr.max_age_s

    def _window_matters(self) -> bool:
        """Whether a window boundary can change anything: a pending job counts against
        a windowed limit (and could ever fit it), or a running job could be stopped."""
        windowed = set(self.quota.windowed)
        for sig_jobs in self._queue.subs.values():
            job = sig_jobs[0]
            if any(i in windowed for i, _u, _a in job.charges) and self.quota.never_fits(job.charges) is None:
                return True
        return any(j.cls.on_window_close == "checkpoint-and-stop" and any(i in windowed for i, _u, _a in j.charges)
                   for j in self._running.values())

    def pending_jobs(self) -> list[Job]:
        """Pending jobs in queue order (a copy)."""
        return list(self._queue)

    def running_jobs(self) -> list[Job]:
        """Jobs holding GPUs (running, preempting, stopping), in submission order."""
        return sorted(self._running.values(), key=lambda j: j.seq)

    def holding(self):
        """Jobs holding GPUs, in no particular order (callers sort by their own keys)."""
        return self._running.values()

    def ends_sorted(self) -> list[tuple[float, int, str]]:
        """``(estimated end, seq, job id)`` of jobs holding GPUs, earliest end first."""
        return self._ends

    def pending_reason(self, job_id: str) -> PendingReason | None:
        """Why a pending job waits now (``None`` if it is not pending)."""
        job = self.jobs.get(job_id)
        if job is None or job.state is not JobState.PENDING:
            return None
        if job.reason_pass != self._pass:
            self._materialize()
            job.reason = self._reason_now(job)
            job.reason_pass = self._pass
        return job.reason

    def _materialize(self) -> None:
        """Compute the last pass's deferred reservations (the state is still the one
        they would have been computed from: only a pass or an event changes it)."""
        if self._deferred:
            for job in self._deferred:
                if job.state is JobState.PENDING:
                    r = backfill.reserve_for(self, job, self.now, self.reservations)
                    if r is not None:
                        self.reservations.append(r)
            self._deferred = []

    def estimated_start(self, job_id: str) -> float | None:
        """The planned start of a pending job that holds a reservation, else ``None``."""
        self._materialize()
        for r in self.reservations:
            if r.job_id == job_id:
                return r.start
        return None

    def nodes_for(self, job: Job) -> frozenset[int]:
        """Indices of the live nodes the job may use."""
        ckey = job.shape.ckey
        found = self._nodeset_cache.get(ckey)
        if found is None:
            found = self._nodeset_cache[ckey] = frozenset(members_of(self.ledger, self.groups_for(job)))
        return found

    def groups_for(self, job: Job) -> list[int]:
        """Shape groups of the ledger whose nodes the job may use (``filters.node_ok``:
        pools, GPU type, memory, selector, taints, driver, cache, sharing kind)."""
        return self._groups_of(job.shape.ckey)

    def _groups_of(self, ckey: tuple) -> list[int]:
        found = self._groups_cache.get(ckey)
        if found is None:
            found = [g.gid for g in self.ledger.groups if node_ok(g.node, ckey)]
            self._groups_cache[ckey] = found
        return found

    # ------------------------------------------------------------ events
    def _apply(self, e: Event, out: list[Decision]) -> None:
        if isinstance(e, JobSubmitted):
            self._submit(e.spec, out)
        elif isinstance(e, JobFinished):
            self._finished(e, out)
        elif isinstance(e, JobCancelled):
            self._cancel(e.job_id, out)
        elif isinstance(e, JobRequeueRequested):
            self._operator_requeue(e.job_id, out)
        elif isinstance(e, NodeAdded):
            self._node_added(e.node)
        elif isinstance(e, NodeLost):
            self._node_lost(e.node, out)
        elif isinstance(e, GpuHealthChanged):
            self._gpu_health(e, out)
        elif isinstance(e, JobAdopted):
            self._adopt(e, out)
        elif isinstance(e, MigReconfigured):
            self._mig_reconfigured(e)
        elif isinstance(e, UsageSample):
            self._sample(e)
        elif isinstance(e, GpuUnmanaged):
            self._gpu_unmanaged(e)
        elif isinstance(e, Tick):
            pass
        else:  # pragma: no cover
            raise TypeError(f"unknown event {e!r}")

    def _make_job(self, spec: JobSpec) -> Job:
        rules = self.rules
        cls = rules.classes[spec.workload_class]
        self._last_submit = max(self._last_submit, spec.submit_time)  # also on restore
        limit = _time_limit(spec, cls)
        estimate = spec.runtime_estimate_s
        if estimate is None and self.predictor is not None:
            estimate = self.predictor.predict(spec.team, spec.user, limit)
        if estimate is None:
            estimate = limit
        if estimate is not None and limit is not None:
            estimate = min(estimate, limit)
        ckey = job_filter(cls, spec)
        shape = self._shape_for(spec, ckey)
        self._seq += 1
        preemptible = cls.preemptible if spec.preemptible is None else spec.preemptible
        checkpointable = cls.checkpointable if spec.checkpointable is None else spec.checkpointable
        evictable = preemptible and not (cls.preempt_only_if_checkpointable and not checkpointable)
        units = self._units(spec, ckey)
        charges = self.quota.charges(spec.team, spec.workload_class, spec.user, units, evictable)
        self._teams_seen.add(spec.team)
        self._users_seen.setdefault(spec.team, set()).add(spec.user)
        return Job(
            spec=spec,
            seq=self._seq,
            cls=cls,
            key=self._order_key(spec, cls, estimate),
            shape=shape,
            charges=charges,
            preemptible=preemptible,
            checkpointable=checkpointable,
            estimate_s=estimate,
            time_limit_s=limit,
            cohort=self._cohort_of(spec.team, cls.pools),
            units=units,
        )

    def _units(self, spec: JobSpec, ckey: tuple) -> int:
        """GPU units (7000 per GPU) the job counts against quotas: whole GPUs x 7000; a
        fraction its milli x 7 (memory only: its share of the largest card it may use,
        rounded up); time-slicing its replicas' share of the card (the most replicas
        a node it may use offers); MPS its clients' SM share; MIG its compute slices
        x 1000 (a seventh of the GPU each)."""
        share = spec.share
        if share is None:
            return spec.gpus * GPU_UNITS
        nodes = [self.ledger.groups[g].node for g in self._groups_of(ckey)] or list(self.rules.nodes)
        if share.kind == "fraction":
            if share.milli:
                return share.milli * 7
            mem = max((n.gpu_mem_mib for n in nodes), default=0)
            return GPU_UNITS if not mem else max(1, min(GPU_UNITS, -(-share.mem_mib * GPU_UNITS // mem)))
        if share.kind == "time_slice":
            reps = max((n.ts_replicas for n in nodes), default=0)
            return GPU_UNITS if not reps else max(1, min(GPU_UNITS, -(-share.slots * GPU_UNITS // reps)))
        if share.kind == "mps":
            return min(GPU_UNITS, share.milli * share.slots * 7)
        try:
            types = {n.gpu_type for n in nodes if n.mig}
            slices = max((mig_profile(t, share.profile).compute_slices for t in sorted(types)), default=7)
        except MigError:
            slices = 7
        return slices * 1000

    def stranded_capacity(self) -> dict:
        """Free GPU capacity and the part of it no pending job could use now, by the
        constraint that strands it (``gpushepherd.core.stranded``)."""
        return stranded_capacity(self)

    def inventory_misfit(self, job: Job) -> str | None:
        """Why no node the scheduler knows (lost ones included, all idle and healthy)
        could ever hold ``job``; ``None`` when one could. Quota limits are not looked
        at (a policy can change; the job then waits with ``ExceedsCapacity``)."""
        spec = job.spec
        key = (job.shape, job.cls.name, spec.gpus, spec.same_node, spec.gpus_per_pod)
        if key in self._misfit_cache:
            return self._misfit_cache[key]
        nodes = [s.node for s in self.ledger.slots]
        misfit = inventory_misfit(nodes, job.cls, spec, job.shape.ckey, self.rules.mig_reconfigure)
        if misfit is None and job.shape.mode in ("multi", "pods"):
            cand = [s.idx for s in self.ledger.slots if node_ok(s.node, job.shape.ckey)]
            totals = {i: whole_gpus(self.ledger.slots[i].node) for i in cand}
            if place_counts(dict(totals), cand, totals, job.shape) is None:
                misfit = f"{describe(job.cls, spec)}: the gang cannot be laid out on the nodes it may use"
        self._misfit_cache[key] = misfit
        return misfit

    def _cohort_of(self, team: str, pools):
        key = (team, pools)
        if key not in self._cohort_cache:
            self._cohort_cache[key] = self.rules.cohort_of(team, pools) if self.rules.cohorts else None
        return self._cohort_cache[key]

    def _shape_for(self, spec: JobSpec, ckey: tuple) -> Shape:
        if spec.share is not None:
            return Shape(1, "share", 1, 1, ckey, spec.share)
        biggest = self._max_node_cache.get(ckey)
        if biggest is None:
            biggest = max((whole_gpus(s.node) for s in self.ledger.slots if node_ok(s.node, ckey)), default=0)
            self._max_node_cache[ckey] = biggest
        if spec.gpus_per_pod and spec.gpus_per_pod < spec.gpus and not spec.same_node:
            return Shape(spec.gpus, "pods", spec.gpus_per_pod, spec.gpus // spec.gpus_per_pod, ckey)
        if spec.same_node or spec.gpus <= biggest or biggest == 0:
            return Shape(spec.gpus, "single", spec.gpus, 1, ckey)
        return Shape(spec.gpus, "multi", spec.gpus, 1, ckey)

    def _sig_id(self, shape: Shape, cls_name: str, charges: tuple, band: int) -> int:
        key = (shape, cls_name, charges, band)
        sid = self._sig_ids.get(key)
        if sid is None:
            sid = self._sig_ids[key] = len(self._sig_ids)
        return sid

    # ------------------------------------------------------------- priority
    def _usage_keys(self, spec: JobSpec) -> tuple[tuple, ...]:
        return (("all",), ("team", spec.team), ("user", spec.team, spec.user))

    def fair_share_factor(self, team: str, user: str = "") -> float:
        """Slurm's classic ``2^(-U/S)`` now: the team's share of all decayed usage over
        its share of the teams' ``shares``; at ``fair_share.level: user`` times the same
        for the user inside the team (its users share it equally)."""
        t = self.now
        usage = self.usage
        teams = self._teams_seen
        total_shares = sum(self.rules.shares.get(x, 1) for x in teams) or 1
        f = factor(usage.value(("team", team), t), usage.value(("all",), t),
                   self.rules.shares.get(team, 1) / total_shares)
        if self.rules.priority.fair_share_level == "user":
            users = self._users_seen.get(team) or {user}
            f *= factor(usage.value(("user", team, user), t), usage.value(("team", team), t), 1 / len(users))
        return f

    def priority_factors(self, job_id: str) -> dict[str, float]:
        """A job's priority factor by factor, weighted (what Slurm's ``sprio`` shows):
        ``class``, ``fair_share``, ``age``, ``size``, ``time_limit`` and their sum ``priority``."""
        job = self.jobs[job_id]
        return self._factors(job.spec, job.cls, job.estimate_s)

    def _factors(self, spec: JobSpec, cls, estimate: float | None = None) -> dict[str, float]:
        pr = self.rules.priority
        out = {"class": pr.class_weight * cls.priority / self._max_prio, "fair_share": 0.0, "age": 0.0, "size": 0.0}
        if pr.fair_share_weight:
            out["fair_share"] = pr.fair_share_weight * self.fair_share_factor(spec.team, spec.user)
        if pr.age_weight and self._recalc_t > spec.submit_time:
            out["age"] = pr.age_weight * min(self._recalc_t - spec.submit_time, pr.max_age_s) / pr.max_age_s
        if pr.size_weight:
            total = self.ledger.healthy_total or 1
            out["size"] = pr.size_weight * min(1.0, spec.gpus / total)
        out["time_limit"] = 0.0
        if pr.time_limit_weight:
            limit = _time_limit(spec, cls)
            if estimate is None:
                estimate = spec.runtime_estimate_s
            if estimate is not None:  # the job's estimate or a prediction, when it has one
                limit = estimate if limit is None else min(limit, estimate)
            if limit is not None:
                out["time_limit"] = pr.time_limit_weight * max(0.0, 1.0 - limit / pr.max_time_limit_s)
        out["priority"] = out["class"] + out["fair_share"] + out["age"] + out["size"] + out["time_limit"]
        return out

    def _order_key(self, spec: JobSpec, cls, estimate: float | None = None) -> tuple:
        """Queue order: priority (high first), then submit time, then job id."""
        pr = self.rules.priority
        if not (pr.dynamic or pr.size_weight or pr.time_limit_weight):
            return (-pr.class_weight * cls.priority / self._max_prio, spec.submit_time, natural_key(spec.id))
        return (-self._factors(spec, cls, estimate)["priority"], spec.submit_time, natural_key(spec.id))

    def _maybe_recalc(self, t: float) -> None:
        """Every ``priority.recalc_s`` (at its multiples) scores are recomputed from the
        usage and waits of now (Slurm's PriorityCalcPeriod)."""
        pr = self.rules.priority
        if not pr.dynamic or t < self._next_recalc:
            return
        self._next_recalc = (math.floor(t / pr.recalc_s) + 1) * pr.recalc_s
        self._recalc_t = t
        if not self._queue:
            return
        jobs = list(self._queue)
        self._queue = PendingQueue()
        for job in jobs:
            job.key = self._order_key(job.spec, job.cls, job.estimate_s)
            self._queue.add(job)
        self._full = True

    def _submit(self, spec: JobSpec, out: list[Decision]) -> None:
        job = self._make_job(spec)
        self.jobs[spec.id] = job
        self._log(job, "", JobState.PENDING, "submitted")
        misfit = self.inventory_misfit(job)
        if misfit is not None:
            job.state = JobState.REJECTED
            job.reason = PendingReason(R.EXCEEDS_CAPACITY, misfit)
            self._log(job, JobState.PENDING, JobState.REJECTED, f"rejected: {misfit}")
            out.append(Reject(self.now, job.id, misfit))
            return
        self._check_deadline(job, "submit")
        self._enqueue(job)
        self._new.append(job)

    def _adopt(self, e: JobAdopted, out: list[Decision]) -> None:
        if e.spec.share is not None:
            self._adopt_share(e)
            return
        if e.placement is None or e.placement.gpu_count != e.spec.gpus:
            raise SpecError(f"job {e.spec.id!r}: placement: {e.placement} is not allowed: exactly {e.spec.gpus} GPUs")
        job = self._make_job(e.spec)
        ledger = self.ledger
        alloc = []
        for name, gpus in e.placement.parts:
            idx = ledger.by_name.get(name)
            if idx is None or not ledger.slots[idx].alive:
                raise SpecError(f"job {e.spec.id!r}: placement: node {name!r} is not allowed: a live node")
            mask = 0
            for g in gpus:
                mask |= 1 << g
            if mask & ~ledger.slots[idx].free_mask:
                raise SpecError(f"job {e.spec.id!r}: placement: GPUs {gpus} of {name} are not allowed: free GPUs")
            alloc.append((idx, mask))
        self.jobs[e.spec.id] = job
        job.runs = 1
        self._occupy(job, alloc, e.started_at if e.started_at is not None else self.now, JobState.RUNNING)
        job.first_start = job.run_start
        self._log(job, "", JobState.RUNNING, f"adopted on {e.placement}")
        self._full = True

    # ------------------------------------------------------- MIG reconfiguration
    def _plan_mig(self, out: list[Decision]) -> None:
        """Re-partition idle MIG GPUs for pending MIG jobs that find no free instance of
        their profile (nor one in a layout being applied): in queue order, each such job
        gets the first idle, healthy MIG GPU of a node it may use whose model has its
        profile. The new layout holds its profile, then the profiles of later waiting
        jobs that still fit (queue order), then the smallest profile in what is left, so
        that no slice is wasted. Emits ``ReconfigureMig``; the GPU serves nobody until
        ``MigReconfigured``."""
        ledger = self.ledger
        waiting = sorted((j for j in self._queue if j.share is not None and j.share.kind == "mig"),
                         key=lambda j: j.key)
        if not waiting:
            return
        supply = {key: [p for _s, p in layout] for key, layout in sorted(self._mig_plans.items())}
        for i, job in enumerate(waiting):
            prof = job.share.profile
            if self._hard_reason(job) is not None or self._cohort_reason(job) is not None:
                continue
            groups = self.groups_for(job)
            if ledger.best_mig(groups, prof) is not None:
                continue  # an instance is free: the job waits for something else
            nodes = self.nodes_for(job)
            served = next((k for k in sorted(supply) if k[0] in nodes and prof in supply[k]), None)
            if served is not None:
                supply[served].remove(prof)
                continue
            target = None
            for idx in members_of(ledger, groups):
                slot = ledger.slots[idx]
                model = mig_model(slot.node.gpu_type)
                if model is None or prof not in profiles_for(model):
                    continue
                for gpu in sorted(slot.migs):
                    card = slot.migs[gpu]
                    if card.idle and card.in_service:
                        target = (idx, gpu)
                        break
                if target is not None:
                    break
            if target is None:
                continue
            idx, gpu = target
            node = ledger.slots[idx].node
            names = [prof]
            for other in waiting[i + 1:]:
                if idx in self.nodes_for(other) and _fits_layout(node.gpu_type, names + [other.share.profile]):
                    names.append(other.share.profile)
            profs = profiles_for(node.gpu_type)
            smallest = min(profs.values(), key=lambda p: (p.size, p.compute_slices, "+" in p.name, p.name)).name
            while _fits_layout(node.gpu_type, names + [smallest]):
                names.append(smallest)
            layout = tuple((inst.start, inst.profile) for inst in layout_from_names(node.gpu_type, names))
            ledger.begin_reconfigure(idx, gpu)
            self._mig_plans[target] = layout
            rest = [p for _s, p in layout]
            rest.remove(prof)
            supply[target] = rest
            self._log(job, JobState.PENDING, JobState.PENDING,
                      f"MIG reconfiguration of {node.name}:{gpu} to {','.join(p for _s, p in layout)}")
            out.append(ReconfigureMig(self.now, job.id, node=node.name, gpu=gpu, layout=layout))
            self._topology_changed()

    def _mig_reconfigured(self, e: MigReconfigured) -> None:
        """Apply a reconfiguration the core asked for; a report for a plan it does not
        hold (its node was lost since, or a repeated report) is stale and ignored."""
        ledger = self.ledger
        idx = ledger.by_name.get(e.node)
        if idx is None or (idx, e.gpu) not in self._mig_plans:
            return
        slot = ledger.slots[idx]
        layout = tuple(MigInstance(start, prof) for start, prof in e.layout)
        validate_layout(slot.node.gpu_type, layout)
        ledger.reconfigure_mig(idx, e.gpu, layout)
        self._mig_plans.pop((idx, e.gpu), None)
        self._topology_changed()

    def _adopt_share(self, e: JobAdopted) -> None:
        """Adopt a running share: a card share on the placement's one GPU, or the free
        instance of its MIG profile with the lowest start on that GPU."""
        spec = e.spec
        where = f"job {spec.id!r}: placement: {e.placement}"
        if e.placement is None or len(e.placement.parts) != 1 or len(e.placement.parts[0][1]) != 1:
            raise SpecError(f"{where} is not allowed: one GPU of one node for a share")
        name, (gpu,) = e.placement.parts[0]
        ledger = self.ledger
        idx = ledger.by_name.get(name)
        if idx is None or not ledger.slots[idx].alive or not 0 <= gpu < ledger.slots[idx].total:
            raise SpecError(f"{where} is not allowed: a GPU of a live node")
        job = self._make_job(spec)
        node = ledger.slots[idx].node
        if not node.supports(spec.share.kind) or not share_fits_card(node, spec.share):
            raise SpecError(f"{where} is not allowed: node {name} does not offer a {spec.share} share")
        try:
            if spec.share.kind == "mig":
                card = ledger.slots[idx].migs.get(gpu)
                pos = card.free_of(spec.share.profile) if card is not None else None
                if pos is None:
                    raise ValueError(f"no free {spec.share.profile} instance on GPU {gpu} of {name}")
                ledger.allocate_mig(spec.id, idx, gpu, pos)
                job.share_at = (gpu, pos)
            else:
                ledger.allocate_share(spec.id, idx, gpu, spec.share.kind, spec.share.need())
                job.share_at = (gpu,)
        except ValueError as exc:
            raise SpecError(f"{where} is not allowed: {exc}") from None
        self.jobs[spec.id] = job
        job.runs = 1
        self._occupy(job, [(idx, 0)], e.started_at if e.started_at is not None else self.now, JobState.RUNNING)
        job.first_start = job.run_start
        self._log(job, "", JobState.RUNNING, f"adopted on {e.placement}[{spec.share}]")
        self._full = True

    def _finished(self, e: JobFinished, out: list[Decision]) -> None:
        job = self.jobs.get(e.job_id)
        if job is None or not job.state.holds_gpus:
            return  # a stale or repeated exit: usage is never released twice
        state, status = job.state, e.status
        if status is ExitStatus.COMPLETED:
            if self.predictor is not None:
                ran = (job.done_s if job.checkpointable else 0.0) + self.now - job.run_start
                self.predictor.observe(job.spec.team, job.spec.user, job.time_limit_s, ran)
            self._end(job, JobState.COMPLETED, "exit 0")
        elif state is JobState.PREEMPTING or status is ExitStatus.PREEMPTED:
            ran = (job.signal_t if job.signal_t is not None else self.now) - job.run_start
            job.done_s = job.done_s + ran if job.checkpointable else 0.0
            if state is JobState.PREEMPTING:
                job.preemptions += 1
            self._detach_from_preemptor(job)
            self._requeue(job, "preempted" if state is JobState.PREEMPTING else "checkpointed, asked to requeue")
        elif state is JobState.STOPPING and job.stop_reason == "memory-overrun":
            self._end(job, JobState.FAILED, "stopped: GPU memory over its declaration")
        elif state is JobState.STOPPING and job.stop_reason == "idle":
            self._end(job, JobState.TIMEOUT, "stopped: idle")
        elif state is JobState.STOPPING or status is ExitStatus.TIMEOUT:
            self._end(job, JobState.TIMEOUT, "time limit")
        elif status is ExitStatus.CANCELLED:
            self._end(job, JobState.CANCELLED, "cancelled")
        else:
            self._end(job, JobState.FAILED, f"exit {status.value.lower()}")

    def _cancel(self, job_id: str, out: list[Decision]) -> None:
        job = self.jobs.get(job_id)
        if job is None or job.state.terminal:
            return
        if job.state is JobState.PENDING:
            self._dequeue(job)
            self._clear_victims(job)
            self._log(job, job.state, JobState.CANCELLED, "cancelled")
            job.state = JobState.CANCELLED
            self._full = True  # it may have held a reservation
            return
        self._detach_from_preemptor(job)
        self._end(job, JobState.CANCELLED, "cancelled")
        out.append(Stop(self.now, job.id, reason="cancelled", grace_s=0.0))

    def _operator_requeue(self, job_id: str, out: list[Decision]) -> None:
        job = self.jobs.get(job_id)
        if job is None or job.state is not JobState.RUNNING:
            return  # requeue of a job that is not running is a no-op (Slurm ticket 24379)
        if job.checkpointable:
            job.done_s += self.now - job.run_start
        else:
            job.done_s = 0.0
        self._requeue(job, "operator requeue")
        out.append(Stop(self.now, job.id, reason="requeue", requeue=True))

    def _validate_hardware(self, e: Event) -> None:
        """Refuse a hardware event before anything of its instant is applied: a GPU
        that does not exist, a node whose MIG layouts are not valid NVIDIA layouts,
        a reconfiguration to an invalid layout.

        Raises:
            ValueError: naming the node, GPU and what is allowed.
        """
        if isinstance(e, NodeAdded) and e.node is not None:
            node = e.node
            seen: set[int] = set()
            for g, layout in node.mig:
                if not isinstance(g, int) or not 0 <= g < node.gpus or g in seen:
                    raise ValueError(f"node {node.name}: mig: GPU {g!r} is not allowed: distinct indices "
                                     f"0..{node.gpus - 1}")
                seen.add(g)
                try:
                    validate_layout(node.gpu_type, layout)
                except MigError as exc:
                    raise ValueError(f"node {node.name}: mig: GPU {g}: {exc}") from None
                if not layout:
                    raise ValueError(f"node {node.name}: mig: GPU {g}: an empty layout is not allowed")
        elif isinstance(e, GpuHealthChanged):
            idx = self.ledger.by_name.get(e.node)
            if idx is None or not 0 <= e.gpu < self.ledger.slots[idx].total:
                raise ValueError(f"gpu health event for unknown GPU {e.node}:{e.gpu}")
        elif isinstance(e, GpuUnmanaged):
            idx = self.ledger.by_name.get(e.node)
            if idx is None:
                raise ValueError(f"unmanaged-GPU report: node: {e.node!r} is not allowed: a node the scheduler "
                                 "knows")
            total = self.ledger.slots[idx].total
            if isinstance(e.gpu, bool) or not isinstance(e.gpu, int) or not 0 <= e.gpu < total:
                raise ValueError(f"unmanaged-GPU report for {e.node}: gpu: {e.gpu!r} is not allowed: an index "
                                 f"0..{total - 1}")
        elif isinstance(e, MigReconfigured):
            idx = self.ledger.by_name.get(e.node)
            if idx is not None and (idx, e.gpu) in self._mig_plans:
                try:
                    validate_layout(self.ledger.slots[idx].node.gpu_type,
                                    tuple(MigInstance(start, prof) for start, prof in e.layout))
                except (MigError, TypeError, ValueError) as exc:
                    raise ValueError(f"MIG reconfiguration of {e.node}:{e.gpu}: {exc}") from None

    def _node_added(self, node: Node | None) -> None:
        if node is None:
            return
        self.ledger.add_node(node)
        self._misfit_cache.clear()
        self._groups_cache.clear()
        self._topology_changed()
        self._max_node_cache.clear()
        for job in list(self._queue):
            self._queue.remove(job)
            if job.share is not None:
                self._pending_shares -= 1
            job.shape = self._shape_for(job.spec, job.shape.ckey)
            self._enqueue(job)
        self._full = True

    def _node_lost(self, name: str, out: list[Decision]) -> None:
        idx = self.ledger.by_name.get(name)
        if idx is None or not self.ledger.slots[idx].alive:
            return
        for job_id in self.ledger.remove_node(idx):
            self._lose(self.jobs[job_id], "node-lost", out)
        for key in [k for k in self._mig_plans if k[0] == idx]:
            del self._mig_plans[key]  # the node comes back (if it does) as it is then
        self._topology_changed()

    def _gpu_health(self, e: GpuHealthChanged, out: list[Decision]) -> None:
        idx = self.ledger.by_name.get(e.node)
        if idx is None or not 0 <= e.gpu < self.ledger.slots[idx].total:
            raise ValueError(f"gpu health event for unknown GPU {e.node}:{e.gpu}")
        holders = self.ledger.set_gpu_health(idx, e.gpu, e.healthy)
        if not e.healthy:
            for holder in holders:
                self._lose(self.jobs[holder], "gpu-failed", out)
        self._topology_changed()

    def _gpu_unmanaged(self, e: GpuUnmanaged) -> None:
        """A GPU runs (or no longer runs) processes the scheduler did not start: while
        it does, nothing of it is handed out; jobs holding it keep it (note 009)."""
        idx = self.ledger.by_name[e.node]
        slot = self.ledger.slots[idx]
        was = (slot.migs[e.gpu].unmanaged if e.gpu in slot.migs else bool(slot.unmanaged_mask >> e.gpu & 1))
        if was == e.unmanaged or not slot.alive:
            return
        for holder in self.ledger.set_gpu_unmanaged(idx, e.gpu, e.unmanaged):
            job = self.jobs[holder]
            self._log(job, job.state, job.state, f"GPU {e.node}:{e.gpu} " + (
                "runs processes the scheduler did not start (unmanaged); the job keeps it" if e.unmanaged
                else "no longer runs unmanaged processes"))
        self._any_unmanaged = bool(self.unmanaged_gpus())
        self._topology_changed()

    def unmanaged_gpus(self) -> list[tuple[str, int]]:
        """``(node, GPU index)`` of the live GPUs reported unmanaged, by node order then index."""
        out = []
        for slot in self.ledger.slots:
            if slot.alive:
                out.extend((slot.node.name, g) for g in range(slot.total)
                           if (slot.migs[g].unmanaged if g in slot.migs else slot.unmanaged_mask >> g & 1))
        return out

    def _topology_changed(self) -> None:
        self._uniform = None
        self._nodeset_cache.clear()
        self._cap_cache.clear()
        self._victim_memo.clear()
        self._room_memo.clear()
        self._full = True

    def _lose(self, job: Job, reason: str, out: list[Decision]) -> None:
        # The job's current run is lost (no chance to checkpoint): it restarts from
        # what it had banked before this run.
        if not job.checkpointable:
            job.done_s = 0.0
        self._detach_from_preemptor(job)
        self._requeue(job, reason)
        out.append(Stop(self.now, job.id, reason=reason, requeue=True))

    # --------------------------------------------------------- transitions
    def _log(self, job: Job, old: JobState | str, new: JobState, reason: str) -> None:
        old_s = old.value if isinstance(old, JobState) else old
        job.history.append(Transition(self.now, old_s, new.value, reason, self._event_no))

    def _enqueue(self, job: Job) -> None:
        rem = job.remaining_estimate()
        job.pend_est = INF if rem is None else rem
        shape = job.shape
        # failures are monotone in the GPU count within one filter and layout (and pod
        # size), so the memo key leaves the count out
        fk = (shape.ckey, shape.mode, shape.per_pod if shape.mode == "pods" else 0, shape.share)
        job.fkey = self._fkey_ids.setdefault(fk, len(self._fkey_ids))
        job.sig = self._sig_id(shape, job.cls.name, job.charges, estimate_band(rem))
        self._queue.add(job)
        if job.share is not None:
            self._pending_shares += 1
        job.state = JobState.PENDING
        job.reason = PendingReason(R.NEW)
        job.reason_pass = -1

    def _dequeue(self, job: Job) -> None:
        self._preemptors.pop(job.id, None)
        self._queue.remove(job)
        if job.share is not None:
            self._pending_shares -= 1

    def _occupy(self, job: Job, alloc: list[tuple[int, int]], started: float, state: JobState) -> None:
        """Give ``job`` the GPUs of ``alloc`` since ``started`` and book everything that
        follows from holding them: usage, the end estimate, the time-limit timer and
        the running counters. Shared by start, adopt and restore."""
        for idx, mask in alloc:
            self.ledger.allocate(job.id, idx, mask)
        self.quota.charge(job.charges, +1)
        if self._anti:
            for idx, _mask in alloc:
                while idx >= len(self._node_classes):
                    self._node_classes.append({})
                on = self._node_classes[idx]
                on[job.cls.name] = on.get(job.cls.name, 0) + 1
        job.alloc = alloc
        job.state = state
        job.run_start = started
        job.vkey = victim_order_key(job)
        self._running[job.id] = job
        self.usage.hold(self._usage_keys(job.spec), self.now, job.units)
        self._class_gpus[job.cls.name] = self._class_gpus.get(job.cls.name, 0) + job.units
        if state is JobState.RUNNING:
            remaining = job.remaining_estimate()
            self._ends_add(job, started + remaining if remaining is not None else INF)
            limit = job.run_limit()
            if limit is not None:
                heapq.heappush(self._timers, (started + limit, job.seq, job.runs, job.id))
            self._count_running(job, +1)
        else:  # signalled before a restart: it leaves at the end of its grace period
            grace = job.cls.grace_period_s if job.checkpointable else 0.0
            self._ends_add(job, (job.signal_t if job.signal_t is not None else self.now) + grace)

    def _start(self, job: Job, counts: Counts, out: list[Decision]) -> None:
        ledger = self.ledger
        parts = []
        alloc = []
        for idx, c in counts:
            slot = ledger.slots[idx]
            mask = pick_gpus(slot.free_mask, c, slot.node.nvlink_islands)
            alloc.append((idx, mask))
            parts.append((slot.node.name, bits(mask)))
        self._launch(job, alloc, Placement(tuple(parts)), out)

    def _start_share(self, job: Job, idx: int, gpu: int, pos: int | None, out: list[Decision]) -> None:
        ledger = self.ledger
        share = job.share
        slot = ledger.slots[idx]
        if pos is None:
            ledger.allocate_share(job.id, idx, gpu, share.kind, share.need())
            job.share_at = (gpu,)
            what = str(share)
        else:
            ledger.allocate_mig(job.id, idx, gpu, pos)
            job.share_at = (gpu, pos)
            what = f"mig:{share.profile}@{slot.migs[gpu].layout[pos].start}"
        self._launch(job, [(idx, 0)], Placement(((slot.node.name, (gpu,)),), share=what), out)

    def _launch(self, job: Job, alloc: list[tuple[int, int]], placement: Placement, out: list[Decision]) -> None:
        job.runs += 1
        job.stop_reason = ""
        if job.first_start is None:
            job.first_start = self.now
        job.victims = set()
        job.plan = []
        job.reclaim = False
        self._occupy(job, alloc, self.now, JobState.RUNNING)
        self._log(job, JobState.PENDING, JobState.RUNNING, f"placed on {placement}")
        out.append(Start(self.now, job.id, placement))
        self._check_deadline(job, "start")

    def _check_deadline(self, job: Job, stage: str) -> None:
        """Flag a job that cannot end by its deadline even if it runs from now on
        without a break (by its remaining estimate, else its time limit)."""
        deadline = job.spec.deadline
        if deadline is None:
            return
        rem = job.remaining_estimate()
        if rem is None:
            rem = job.run_limit()
        if rem is None:
            return
        end = self.now + rem
        if end > deadline:
            job.deadline_flags.append((self.now, stage, end))
            self._log(job, job.state, job.state, f"deadline at risk ({stage}): ends at {end:g} at the earliest, "
                      f"deadline {deadline:g}")

    def deadline_at_risk(self, job_id: str) -> list[tuple[float, str, float]]:
        """``(time, "submit" | "start", earliest end)`` each time the job was found
        unable to meet its deadline (empty: never, or no deadline)."""
        return list(self.jobs[job_id].deadline_flags)

    def _release(self, job: Job) -> None:
        if job.state is JobState.RUNNING:
            self._count_running(job, -1)
        for idx, mask in job.alloc:
            self.ledger.release(job.id, idx, mask)
            if self._anti:
                on = self._node_classes[idx]
                on[job.cls.name] -= 1
                if not on[job.cls.name]:
                    del on[job.cls.name]
            if job.share_at:
                if len(job.share_at) == 1:
                    self.ledger.release_share(job.id, idx, job.share_at[0])
                else:
                    self.ledger.release_mig(job.id, idx, *job.share_at)
        job.alloc = []
        job.share_at = ()
        self.quota.charge(job.charges, -1)
        self.usage.hold(self._usage_keys(job.spec), self.now, -job.units)
        self._ends_remove(job)
        del self._running[job.id]
        left = self._class_gpus[job.cls.name] - job.units
        if left:
            self._class_gpus[job.cls.name] = left
        else:
            del self._class_gpus[job.cls.name]
        self._full = True

    def _count_running(self, job: Job, sign: int) -> None:
        """Index of jobs in state RUNNING by class priority (counts of all; the
        preemptible ones themselves, for victim searches)."""
        p = job.cls.priority
        left = self._running_prio.get(p, 0) + sign
        if left:
            self._running_prio[p] = left
        else:
            del self._running_prio[p]
        if job.preemptible and job.share is None:  # shares free no whole GPU: never class-preemption victims
            if sign > 0:
                self._preemptible.setdefault(p, {})[job.id] = job
            else:
                table = self._preemptible[p]
                del table[job.id]
                if not table:
                    del self._preemptible[p]
        victim = job.preemptible and not (job.cls.preempt_only_if_checkpointable and not job.checkpointable)
        first = self._prio_pos[p] + 1  # thresholds above this class
        n = len(self._prios)
        for idx, mask in job.alloc:
            while idx >= len(self._lower_all):
                self._lower_all.append([0] * n)
                self._lower_vic.append([0] * n)
            g = sign * mask.bit_count()
            row = self._lower_all[idx]
            for j in range(first, n):
                row[j] += g
            if victim:
                row = self._lower_vic[idx]
                for j in range(first, n):
                    row[j] += g

    def makeable_nodes(self, prio: int, victims_only: bool) -> int:
        """How many live nodes would be whole free if every RUNNING job of a lower class
        than ``prio`` (with ``victims_only``: that may be a victim, minimum runtime
        aside) were gone. A necessary condition for multi-node preemption."""
        changes = self.ledger.changes
        if self._mk_pos != len(changes):
            n = len(self._prios)
            for idx in set(changes[self._mk_pos:]):
                while idx >= len(self._mk_flags):
                    self._mk_flags.append([[False] * n, [False] * n])
                slot = self.ledger.slots[idx]
                for which, table in ((0, self._lower_all), (1, self._lower_vic)):
                    flags = self._mk_flags[idx][which]
                    counts = self._mk_count[which]
                    row = table[idx] if idx < len(table) else [0] * n
                    for j in range(n):
                        ok = slot.alive and slot.healthy > 0 and slot.free + row[j] >= slot.healthy
                        if ok != flags[j]:
                            flags[j] = ok
                            counts[j] += 1 if ok else -1
            self._mk_pos = len(changes)
        return self._mk_count[1 if victims_only else 0][self._prio_pos[prio]]

    def uniform_nodes(self) -> int:
        """The GPU count of every live node when all have the same, else 0."""
        if self._uniform is None:
            sizes = {s.total for s in self.ledger.slots if s.alive}
            self._uniform = sizes.pop() if len(sizes) == 1 else 0
        return self._uniform

    def lower_gpus(self, idx: int, prio: int, victims_only: bool) -> int:
        """GPUs on node ``idx`` held by RUNNING jobs of a class priority below ``prio``
        (with ``victims_only``: only jobs that may be preempted, minimum runtime aside)."""
        table = self._lower_vic if victims_only else self._lower_all
        return table[idx][self._prio_pos[prio]] if idx < len(table) else 0

    def preemptible_by_priority(self) -> dict[int, dict[str, Job]]:
        """RUNNING preemptible jobs by class priority (read-only view for the victim search)."""
        return self._preemptible

    def _ends_add(self, job: Job, end: float) -> None:
        job.end_est = end
        insort(self._ends, (end, job.seq, job.id))

    def _ends_remove(self, job: Job) -> None:
        i = bisect_left(self._ends, (job.end_est, job.seq, job.id))
        assert self._ends[i][1] == job.seq, f"{job.id} missing from the end list"
        del self._ends[i]

    def _signal(self, job: Job, state: JobState, grace: float) -> None:
        """RUNNING -> PREEMPTING or STOPPING: the job keeps its GPUs until it exits,
        at the latest ``grace`` seconds from now."""
        self._count_running(job, -1)
        self._ends_remove(job)
        self.ledger.changes.extend(idx for idx, _ in job.alloc)  # no longer a victim candidate
        job.state = state
        job.signal_t = self.now
        self._ends_add(job, self.now + grace)

    def _end(self, job: Job, state: JobState, reason: str) -> None:
        old = job.state
        self._release(job)
        self._clear_victims(job)
        job.state = state
        self._log(job, old, state, reason)

    def _requeue(self, job: Job, reason: str) -> None:
        old = job.state
        self._release(job)
        job.signal_t = None
        job.preemptor = None
        self._log(job, old, JobState.PENDING, reason)
        self._enqueue(job)

    def _detach_from_preemptor(self, victim: Job) -> None:
        if victim.preemptor is not None:
            p = self.jobs.get(victim.preemptor)
            if p is not None:
                p.victims.discard(victim.id)
            victim.preemptor = None

    def _clear_victims(self, job: Job) -> None:
        for vid in sorted(job.victims):
            v = self.jobs[vid]
            if v.preemptor == job.id:
                v.preemptor = None
        job.victims = set()
        job.plan = []
        job.reclaim = False

    def _preempt(self, victim: Job, preemptor: Job | None, out: list[Decision], reason: str = "") -> None:
        grace = victim.cls.grace_period_s if victim.checkpointable else 0.0
        self._signal(victim, JobState.PREEMPTING, grace)
        victim.preemptor = preemptor.id if preemptor is not None else None
        why = f"preempted for {preemptor.id}" if preemptor is not None else f"stopped: {reason}"
        self._log(victim, JobState.RUNNING, JobState.PREEMPTING, f"{why} (grace {grace:g} s)")
        out.append(Preempt(self.now, victim.id, grace_s=grace,
                           reason=reason or f"priority:{preemptor.cls.name}",
                           preemptor=preemptor.id if preemptor is not None else ""))

    # --------------------------------------------------------------- windows
    def _windows_at(self, t: float) -> list[tuple[int, int]]:
        """Bring time-windowed limits to ``t``; a change is a configuration change with
        its own pass. Returns the limits that tightened, with their new value."""
        if not self.quota.windowed:
            return []
        changes = self.quota.set_time(t)
        if changes:
            self._full = True
        return [(i, new) for i, old, new in changes if new < old]

    def _close_windows(self, tightened: list[tuple[int, int]], out: list[Decision]) -> None:
        """A window closed: jobs over the new limit whose class says
        ``checkpoint-and-stop`` are preempted (youngest first, with their grace period)
        until the usage fits; ``drain`` classes keep running."""
        quota = self.quota
        for i, new_max in tightened:
            over: dict[str, int] = {}
            for (li, user), used in quota.usage.items():
                if li == i and used > new_max:
                    over[user] = used - new_max
            if not over:
                continue
            candidates = sorted(
                (j for j in self._running.values()
                 if j.state is JobState.RUNNING and j.preemptible and j.cls.on_window_close == "checkpoint-and-stop"),
                key=lambda j: j.vkey)
            for job in candidates:
                for li, user, amount in job.charges:
                    if li == i and over.get(user, 0) > 0:
                        over[user] -= amount
                        self._preempt(job, None, out, reason=f"window-closed:{quota.limits[i].path}")
                        break

    # --------------------------------------------------------------- expire
    def _expire(self, out: list[Decision]) -> None:
        """Step 1: stop jobs whose time limit has passed."""
        timers = self._timers
        while timers and timers[0][0] <= self.now:
            _t, _seq, run, job_id = heapq.heappop(timers)
            job = self.jobs[job_id]
            if job.state is not JobState.RUNNING or job.runs != run:
                continue
            grace = job.cls.grace_period_s if job.checkpointable else 0.0
            self._stop(job, "time-limit", grace, "time limit reached", out)
        if self._mem_stops:
            stops, self._mem_stops = self._mem_stops, []
            for job in sorted(stops, key=lambda j: j.seq):
                if job.state is JobState.RUNNING:
                    tr = self._tracks[job.id]
                    self._stop(job, "memory-overrun", 0.0,
                               f"stopped: GPU memory {tr.run_peak_mib} MiB over the {declared_mib(job.spec)} MiB "
                               "declared, on a shared GPU", out)
        idle = self._idle_timers
        while idle and idle[0][0] <= self.now:
            entry = heapq.heappop(idle)
            if not self._idle_entry_live(entry):
                continue
            job = self.jobs[entry[3]]
            rule = job.cls.idle_stop
            grace = job.cls.grace_period_s if job.checkpointable else 0.0
            self._stop(job, "idle", grace, f"idle for {self.now - entry[4]:g} s below {rule.below_util_pct:g} % GPU "
                       f"utilisation (grace {grace:g} s)", out)

    def _stop(self, job: Job, reason: str, grace: float, why: str, out: list[Decision]) -> None:
        """RUNNING -> STOPPING for ``reason``: the job keeps its GPUs through ``grace``."""
        self._signal(job, JobState.STOPPING, grace)
        job.stop_reason = reason
        self._full = True  # its end moved: plans built on the old one are redone
        self._log(job, JobState.RUNNING, JobState.STOPPING, why)
        out.append(Stop(self.now, job.id, reason=reason, grace_s=grace))

    # ---------------------------------------------------------- usage samples
    def _idle_entry_live(self, entry: tuple[float, int, int, str, float]) -> bool:
        _t, _seq, run, job_id, since = entry
        job = self.jobs[job_id]
        tr = self._tracks.get(job_id)
        return (job.state is JobState.RUNNING and job.runs == run and tr is not None and tr.run == run
                and tr.idle_since == since)

    def _sample(self, e: UsageSample) -> None:
        """Take a usage sample (note 009): peaks, the memory flag, the idle stretch."""
        job = self.jobs.get(e.job_id)
        if job is None or not job.state.holds_gpus:
            return  # a late sample of a run that ended: nothing to say about any run
        tr = self._tracks.get(job.id)
        if tr is None:
            tr = self._tracks[job.id] = UsageTrack()
        if tr.run != job.runs:
            tr.new_run(job.runs)
        util, mem = float(e.gpu_util_pct), e.mem_used_mib
        tr.samples += 1
        tr.last_util = util
        tr.last_t = self.now
        tr.run_peak_mib = max(tr.run_peak_mib, mem)
        tr.peak_mib = max(tr.peak_mib, mem)
        declared = declared_mib(job.spec)
        if declared is not None and mem > declared and tr.over_at is None:
            tr.over_at = self.now
            tr.over_runs += 1
            shared = job.share is not None and job.share.kind in SHARED_MEMORY_KINDS
            stop = shared and job.cls.memory_overrun == "stop" and job.preemptible
            self._log(job, job.state, job.state, f"GPU memory {mem} MiB over the {declared} MiB declared"
                      + (" on a shared GPU: stopping" if stop else " (flagged)"))
            if stop and job.state is JobState.RUNNING:
                self._mem_stops.append(job)
        rule = job.cls.idle_stop
        if rule is None or not job.preemptible or job.state is not JobState.RUNNING:
            return
        if util >= rule.below_util_pct:
            tr.idle_since = None
        elif tr.idle_since is None:
            tr.idle_since = max(self.now, job.run_start + rule.setup_s)  # setup counts as activity
            heapq.heappush(self._idle_timers, (tr.idle_since + rule.after_s, job.seq, job.runs, job.id,
                                               tr.idle_since))

    def usage_of(self, job_id: str) -> dict | None:
        """What the GPU samples of a job said (``None``: unknown job). Keys:
        ``samples`` (of the current or last run), ``last_util_pct`` (percent, ``None``
        without samples), ``last_sample_t`` (seconds), ``idle_since`` (seconds, ``None``:
        not idle or no idle stop), ``idle_stop_at`` (when it will be stopped if it stays
        idle), ``run_peak_mib`` / ``peak_mib`` (MiB, this run / all runs),
        ``declared_mib`` (MiB summed over its GPUs, ``None``: none declared),
        ``over`` (this run exceeded it), ``over_at``, ``over_runs``, ``stop_reason``."""
        job = self.jobs.get(job_id)
        if job is None:
            return None
        tr = self._tracks.get(job_id) or UsageTrack()
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

    # -------------------------------------------------------------- the pass
    def _schedule(self, out: list[Decision]) -> None:
        new, self._new = self._new, []
        if not self._queue:
            self._full = False
            return
        wakeups = self._wakeups
        while wakeups and wakeups[0] <= self.now:
            heapq.heappop(wakeups)
            self._full = True  # a victim reached the minimum runtime
        if not self._full:
            if not new:
                return
            first = self._first_blocked
            if first is None or any(j.key < first for j in new):
                self._full = True
            elif not self.rules.backfill_enabled:
                return  # strict priority order: nobody passes the first blocked job
        if self._full:
            self._full = False
            self._pass += 1
            self.reservations = []
            self._deferred = []
            self._first_blocked = None
            self._scan_full(out)
        else:
            # Only submissions changed and every new job queues behind the first job
            # the last pass could not start: earlier outcomes stand, so only the new
            # jobs are looked at, against the reservations in force.
            before = len(out)
            self._materialize()
            self._scan_jobs(sorted(new, key=lambda j: j.key), out)
            if len(out) > before:
                self._pass += 1  # GPUs were taken: other jobs' reasons are recomputed on demand
                for job in new:
                    if job.reason_pass != -1:  # -1: worked out when asked
                        job.reason_pass = self._pass

    #: how many jobs of one sub-queue a pass looks through for one short enough to
    #: backfill (its estimate band straddles the reservation's start)
    STRADDLE_DEPTH = 32

    def _scan_full(self, out: list[Decision]) -> None:
        """Steps 3-7 over every pending job, in order, by sub-queue heads.

        A sub-queue's next job is looked at only when it could do better than the one
        before it: after a start or a preemption; after a reservation while the
        reservation depth is not reached; or, after a reservation conflict, for a job
        short enough to end before the reservations (its estimate band straddles them:
        at most ``STRADDLE_DEPTH`` jobs deep). Jobs not looked at get their reason on
        demand. Free GPUs only shrink during a pass, so a skipped job would have been
        blocked the same way."""
        ctx = _Pass(self)
        # GPUs freed by exiting victims are held for their preemptor from the start of
        # the pass (no eviction loops); jobs queued ahead of it are not held back.
        for p in sorted(self._preemptors.values(), key=lambda j: j.key):
            ctx.res.append(backfill.hold_for_preemptor(self, p, self.now))
        subs = self._queue.subs
        heads = list(self._queue.heads)
        cont: list[tuple[tuple, int, int]] = []
        hi = 0
        n_heads = len(heads)
        while True:
            if cont and (hi >= n_heads or cont[0][0] < heads[hi][0]):
                _key, sig, idx = heapq.heappop(cont)
            elif hi < n_heads:
                sig = heads[hi][1]
                hi += 1
                idx = 0
            else:
                break
            sub = subs[sig]
            job = sub[idx]
            outcome = self._consider(job, ctx, out)
            if outcome is _BREAK:
                break
            if outcome is _DEAD:
                continue
            nxt = idx + 1
            if outcome is _SHORTER:
                limit = ctx.short_limit()
                stop = min(len(sub), nxt + self.STRADDLE_DEPTH)
                while nxt < stop:
                    if sub[nxt].pend_est <= limit:
                        break
                    nxt += 1
                else:
                    continue
            if nxt < len(sub):
                heapq.heappush(cont, (sub[nxt].key, sig, nxt))
        ctx.finish()

    def _scan_jobs(self, jobs: list[Job], out: list[Decision]) -> None:
        """Steps 3-7 for ``jobs`` alone, against the reservations in force."""
        ctx = _Pass(self)
        for job in jobs:
            if job.state is JobState.PENDING and self._consider(job, ctx, out) is _BREAK:
                break
        ctx.finish()

    def _consider(self, job: Job, ctx: "_Pass", out: list[Decision]) -> object:
        """One job's turn in a pass; returns what the pass may do with its sub-queue."""
        ledger = self.ledger
        res = ctx.res
        now = self.now
        if job.id in self._preemptors:
            ctx.materialize()
            outcome = self._try_preemptor(job, res, out)
            if outcome == "started":
                ctx.started.append(job)
                ctx.took_gpus()
                return _GO
            if outcome == "waiting":
                return _GO
        if job.shape.mode == "share":
            return self._consider_share(job, ctx, out)
        prio = job.cls.priority
        can_preempt = ctx.minp is not None and ctx.minp < prio
        can_reclaim = job.cohort is not None and self._may_reclaim(job)
        if can_reclaim:
            can_preempt = True
        if ledger.free_total == 0 and not can_preempt and not self._preemptors:
            self._note_blocked(job)
            if self._pending_shares:
                return _DEAD  # a share queued behind may still fit a shared card or a MIG instance
            return _BREAK  # nothing can start without evicting, and nothing may be evicted
        shape = job.shape
        fkey = job.fkey
        k = shape.k
        if ctx.n_reserved >= ctx.depth and (not can_preempt or ctx.fail_preempt.get((fkey, prio), INF) <= k):
            if ctx.fail_fit.get(fkey, INF) <= k:
                # fits nowhere, cannot preempt, gets no reservation: blocked whatever its
                # quota says (its reason is worked out when someone asks)
                job.reason_pass = -1
                self._note_blocked(job)
                return _DEAD
            if ctx.fail_around.get((fkey, True), INF) <= k and job.pend_est > ctx.short_limit():
                # every placement would delay a reservation; a shorter job might not
                job.reason_pass = -1
                self._note_blocked(job)
                return _SHORTER
        if ctx.budget <= 0:
            return _BREAK
        ctx.budget -= 1
        job.reason_pass = self._pass
        end = now + job.pend_est
        # 3. admit: hard limits first (they take precedence over capacity)
        if self._hard_reason(job) is not None:
            job.reason_pass = -1  # named when asked, with the usage as it is then
            return _DEAD
        # cohort capacity (borrowed quota can be reclaimed: a capacity reason)
        short = self.quota.blocking(job.charges, cohort=True) if job.cohort is not None else None
        # 4. place on free GPUs
        counts = None
        if ctx.fail_fit.get(fkey, INF) > shape.k:
            counts = self._place_whole(job)
            if counts is None:
                ctx.fail_fit[fkey] = shape.k
        if short is not None:
            # the cohort has no quota to spare: only reclaiming borrowed GPUs helps
            if can_reclaim and self._reclaim(job, ctx, out):
                return _GO
            job.reason_pass = -1
            self._note_blocked(job)
            return _DEAD
        if counts is not None:
            held = self._class_hold(job)
            if held is not None:
                job.reason = held
                self._note_blocked(job)
                return _DEAD
            ctx.materialize()
            blocker = backfill.quota_conflict(res, job.charges, end, job.key) if res else None
            if blocker is None and res:
                blocker = backfill.conflict(res, counts, end, job.key)
                if blocker is not None:
                    akey = (fkey, end > min(r.start for r in res))
                    if ctx.fail_around.get(akey, INF) > shape.k:
                        counts = backfill.place_around(self, job, res, end)
                        if counts is not None and self._anti and not self.avoided_nodes(job).isdisjoint(
                                i for i, _c in counts):
                            counts = None
                        if counts is None:
                            ctx.fail_around[akey] = shape.k
                        else:
                            blocker = None
            if blocker is None:
                self._start(job, counts, out)
                if res:
                    backfill.consume(res, counts, end, job.charges, job.key)
                ctx.started.append(job)
                ctx.took_gpus()
                return _GO
            job.reason = PendingReason(R.HELD_FOR_PREEMPTOR if blocker.hold else R.RESERVED_FOR, blocker.job_id)
            self._note_blocked(job)
            return _SHORTER
        # 7. preempt lower-priority work (tried before reservations so that a
        #    higher-priority job never waits behind a backfill plan)
        if can_preempt:
            pkey = (fkey, prio)
            if ctx.fail_preempt.get(pkey, INF) > shape.k and ctx.minp is not None and ctx.minp < prio:
                ctx.materialize()
                found = self._victims(job, res)
                if found is not None:
                    self._begin_preemption(job, *found, res, out)
                    ctx.minp = min(self._preemptible, default=None)
                    return _GO
                ctx.fail_preempt[pkey] = shape.k
            if can_reclaim and self._reclaim(job, ctx, out):
                return _GO
        # capacity reason, then 5. a reservation for the top blocked jobs
        # (Resources, NoFit or NoPreemptibleVictims: worked out when someone asks)
        job.reason_pass = -1
        self._note_blocked(job)
        if not self.rules.backfill_enabled:
            return _BREAK  # strict priority order: nobody passes a blocked job
        if ctx.n_reserved < ctx.depth:
            # 5. its reservation, computed when a later job first needs it (a job whose
            # start cannot be planned still takes its slot of the reservation depth)
            ctx.deferred.append(job)
            ctx.n_reserved += 1
            if ctx.n_reserved < ctx.depth:
                return _GO
        return _DEAD

    def avoided_nodes(self, job: Job) -> frozenset[int]:
        """Nodes the job may not start on now: a job of a class it avoids holds GPUs
        there (``classes.X.avoid_nodes_with``, symmetric)."""
        avoid = job.cls.avoid
        if not avoid or not self._anti:
            return frozenset()
        return frozenset(i for i, on in enumerate(self._node_classes) if on and not avoid.isdisjoint(on))

    def _place_whole(self, job: Job) -> Counts | None:
        """``place_live`` on the nodes the job may use; with a cache key it does not
        require, the nodes that hold it first (model/dataset locality); never on a node
        it avoids (class anti-affinity)."""
        groups = self.groups_for(job)
        avoided = self.avoided_nodes(job)
        if avoided:
            ledger = self.ledger
            key = job.spec.cache_key
            cand = [i for i in members_of(ledger, groups) if i not in avoided]
            tiers = [cand]
            if key and not job.spec.cache_required:
                tiers = [[i for i in cand if key in ledger.slots[i].node.cached], cand]
            for tier in tiers:
                avail = {i: ledger.slots[i].free for i in tier}
                totals = {i: ledger.slots[i].healthy for i in tier}
                counts = place_counts(avail, tier, totals, job.shape) if tier else None
                if counts is not None:
                    return counts
            return None
        key = job.spec.cache_key
        if key and not job.spec.cache_required:
            cached = [g for g in groups if key in self.ledger.groups[g].node.cached]
            if cached and len(cached) < len(groups):
                counts = place_live(self.ledger, cached, job.shape)
                if counts is not None:
                    return counts
        return place_live(self.ledger, groups, job.shape)

    def _consider_share(self, job: Job, ctx: "_Pass", out: list[Decision]) -> object:
        """A share's turn: hard limits, cohort quota, then the tightest card that fits
        (a fresh GPU only when none does, and then only where no reservation of a job
        ahead is delayed). Shares neither preempt nor take reservations."""
        if ctx.budget <= 0:
            return _BREAK
        ctx.budget -= 1
        fkey = job.fkey
        job.reason_pass = -1  # named when asked
        if ctx.fail_fit.get(fkey, INF) <= 1 or self._hard_reason(job) is not None:
            self._note_blocked(job)
            return _DEAD
        if job.cohort is not None and self.quota.blocking(job.charges, cohort=True) is not None:
            self._note_blocked(job)
            return _DEAD
        ctx.materialize()
        res = ctx.res
        end = self.now + job.pend_est
        if res and backfill.quota_conflict(res, job.charges, end, job.key) is not None:
            self._note_blocked(job)
            return _DEAD
        spot = self._place_share(job, res, end)
        if spot is None:
            ctx.fail_fit[fkey] = 1
            self._note_blocked(job)
            return _DEAD
        idx, gpu, pos, fresh = spot
        if fresh and self._class_hold(job) is not None:
            self._note_blocked(job)
            return _DEAD
        self._start_share(job, idx, gpu, pos, out)
        if res:
            backfill.consume(res, [(idx, 1)] if fresh else [], end, job.charges, job.key)
        ctx.started.append(job)
        ctx.took_gpus()
        return _GO

    def _place_share(self, job: Job, res: list[backfill.Reservation] | None = None,
                     end: float = INF) -> tuple[int, int, int | None, bool] | None:
        """Where a share goes: ``(node index, GPU, MIG instance position or None,
        opens a fresh GPU)``. Nodes that hold the job's cache key first (when it
        names one), then the rest; within them the tightest card that fits, else a
        whole free GPU by bin-packing whose start delays no reservation in ``res``."""
        groups = self.groups_for(job)
        spec = job.spec
        tiers = [groups]
        if spec.cache_key and not spec.cache_required:
            cached = [g for g in groups if spec.cache_key in self.ledger.groups[g].node.cached]
            if cached and len(cached) < len(groups):
                tiers = [cached, [g for g in groups if g not in cached]]
        for tier in tiers:
            spot = self._place_share_in(job, tier, res, end)
            if spot is not None:
                return spot
        return None

    def _place_share_in(self, job: Job, groups: list[int], res, end: float):
        ledger = self.ledger
        share = job.share
        avoided = self.avoided_nodes(job)
        if share.kind == "mig":
            found = ledger.best_mig(groups, share.profile, avoided)
            return None if found is None else (found[0], found[1], found[2], False)
        need = share.need()
        found = ledger.best_card(groups, share.kind, *need, exclude=avoided)
        if found is not None:
            return found[0], found[1], None, False
        fits = [g for g in groups if share_fits_card(ledger.groups[g].node, share)]
        if not fits or ledger.free_in(fits) == 0:
            return None
        idx = ledger.best_fit(fits, 1)
        if idx is not None and (idx in avoided or (res and backfill.conflict(res, [(idx, 1)], end, job.key)
                                                   is not None)):
            idx = None
            for cand in sorted(members_of(ledger, fits), key=lambda i: (ledger.slots[i].free, i)):
                if (ledger.slots[cand].free and cand not in avoided
                        and (not res or backfill.conflict(res, [(cand, 1)], end, job.key) is None)):
                    idx = cand
                    break
        if idx is None:
            return None
        slot = ledger.slots[idx]
        mask = pick_gpus(slot.free_mask, 1, slot.node.nvlink_islands)
        return idx, mask.bit_length() - 1, None, True

    def _begin_preemption(self, job: Job, victims: list[Job], plan, res: list[backfill.Reservation],
                          out: list[Decision], reclaim: bool = False) -> None:
        """Signal ``victims`` for ``job``; the GPUs they free are held for it."""
        for v in victims:
            self._preempt(v, job, out, "reclaim" if reclaim else "")
        job.victims = {v.id for v in victims}
        job.plan = plan
        job.reclaim = reclaim
        self._preemptors[job.id] = job
        res.append(backfill.hold_for_preemptor(self, job, self.now))
        job.reason = PendingReason(R.PREEMPTION_IN_PROGRESS, ",".join(sorted(job.victims, key=natural_key)))
        why = "reclaiming quota from " if reclaim else "preempting "
        self._log(job, JobState.PENDING, JobState.PENDING, why + ",".join(v.id for v in victims))
        self._note_blocked(job)

    def _may_reclaim(self, job: Job) -> bool:
        """Whether ``job`` may reclaim lent quota: its cohort reclaims, its team stays
        within its nominal quota once the job runs, and some other member borrows."""
        if not self.rules.preemption_enabled:
            return False
        cohort, member = job.cohort
        if cohort.reclaim == "never":
            return False
        usage = self.quota.usage
        if usage.get((member.limit, ""), 0) + job.units > member.nominal * GPU_UNITS:
            return False
        return any(m is not member and usage.get((m.limit, ""), 0) > m.nominal * GPU_UNITS for m in cohort.members)

    def _reclaim(self, job: Job, ctx: "_Pass", out: list[Decision]) -> bool:
        """Preempt borrowers of the job's cohort (and lower-class work) so that it fits
        its GPUs and quota; ``False`` when no victim set works."""
        ctx.materialize()
        res = ctx.res
        rem = job.remaining_estimate()
        end = self.now + rem if rem is not None else INF
        claimed = frozenset(n for r in res if not (end <= r.start or job.key < r.key) for n in r.claims)
        claimed |= self.avoided_nodes(job)  # it never preempts onto a node it may not use
        found, until = reclaim_victims(self, job, self.now, claimed)
        if found is None:
            if until != INF and until > self.now and until not in self._wakeups:
                heapq.heappush(self._wakeups, until)
            return False
        self._begin_preemption(job, *found, res, out, reclaim=True)
        ctx.minp = min(self._preemptible, default=None)
        return True

    def _try_preemptor(self, job: Job, res: list[backfill.Reservation], out: list[Decision]) -> str:
        """A preemptor's turn: ``started`` if it fits now without taking what another
        reservation needs; ``waiting`` while victims are still exiting (its hold stays);
        ``released`` when its victims are gone and it still does not fit (the hold is
        dropped and it is scheduled like any job)."""
        job.reason_pass = self._pass
        counts = self._place_whole(job)
        rem = job.remaining_estimate()
        end = self.now + rem if rem is not None else INF
        others = [r for r in res if r.job_id != job.id]
        if (counts is not None and self._hard_reason(job) is None
                and (job.cohort is None or self.quota.blocking(job.charges, cohort=True) is None)
                and backfill.conflict(others, counts, end, job.key) is None
                and backfill.quota_conflict(others, job.charges, end, job.key) is None):
            res[:] = others
            self._start(job, counts, out)
            backfill.consume(res, counts, end, job.charges, job.key)
            self._pass += 1  # reasons given earlier in this pass may name its hold: recompute on demand
            job.reason_pass = self._pass
            return "started"
        if job.victims:
            job.reason = PendingReason(R.PREEMPTION_IN_PROGRESS, ",".join(sorted(job.victims, key=natural_key)))
            self._note_blocked(job)
            return "waiting"
        res[:] = others
        del self._preemptors[job.id]
        job.plan = []
        job.reclaim = False
        return "released"

    def _note_blocked(self, job: Job) -> None:
        first = self._first_blocked
        if first is None or job.key < first:
            self._first_blocked = job.key

    def _could_preempt(self, job: Job) -> bool:
        """Whether some running preemptible job has a lower class priority."""
        p = job.cls.priority
        for q in self._preemptible:
            if q < p:
                return True
        return False

    # ------------------------------------------------------------- reasons
    def _hard_reason(self, job: Job) -> PendingReason | None:
        quota = self.quota
        never = quota.never_fits(job.charges)
        if never is not None:
            return PendingReason(R.EXCEEDS_CAPACITY, f"{never.path}={never.max}")
        blocking = quota.blocking(job.charges)
        if blocking is not None:
            i, used = blocking
            lim, now_max, window = quota.limits[i], quota.current[i], quota.window[i]
            if lim.windows:  # the limit in force is a time window's
                where = f"@{window}" if window else "@outside windows"
                return PendingReason(R.WINDOW_LIMIT, f"{lim.path}{where}={quota.fmt(i, now_max)}, "
                                     f"in use {quota.fmt(i, used)}")
            return PendingReason(R.QUOTA_EXCEEDED, f"{lim.path}={quota.fmt(i, now_max)}, in use {quota.fmt(i, used)}")
        if self._exceeds_capacity(job):
            return (self._unmanaged_reason(job, capacity=True)
                    or PendingReason(R.EXCEEDS_CAPACITY, self._capacity_detail(job)))
        return None

    def _unmanaged_reason(self, job: Job, capacity: bool = False) -> PendingReason | None:
        """``Resources(unmanaged:NODE:GPU,...)`` when GPUs the job may use run processes
        the scheduler did not start and the job would fit were they free (with
        ``capacity``: were they in service, all GPUs empty); else ``None``."""
        if not self._any_unmanaged:
            return None  # the common case, without a walk over the nodes
        ledger = self.ledger
        cand = [i for i in members_of(ledger, self.groups_for(job))
                if ledger.slots[i].unmanaged_mask or any(c.unmanaged for c in ledger.slots[i].migs.values())]
        if not cand:
            return None
        names = []
        for i in cand:
            slot = ledger.slots[i]
            names.extend(f"{slot.node.name}:{g}" for g in range(slot.total)
                         if (slot.migs[g].unmanaged if g in slot.migs else slot.unmanaged_mask >> g & 1))
        detail = PendingReason(R.RESOURCES, "unmanaged:" + ",".join(names))
        if job.shape.mode == "share":
            return detail  # a share could take a card of any of them
        cand = members_of(ledger, self.groups_for(job))
        extra = {i: (ledger.slots[i].unmanaged_mask & ~ledger.slots[i].sick_mask).bit_count() for i in cand}
        idle = {i: extra[i] - sum(1 for g in bits(ledger.slots[i].unmanaged_mask) if ledger.slots[i].holder[g])
                for i in cand}
        totals = {i: ledger.slots[i].healthy + extra[i] for i in cand}
        avail = dict(totals) if capacity else {i: ledger.slots[i].free + idle[i] for i in cand}
        return detail if place_counts(avail, cand, totals, job.shape) is not None else None

    def _exceeds_capacity(self, job: Job) -> bool:
        """The job can never fit the healthy nodes it may use, even all empty (too big
        for any node, for all of them together, or a gang that cannot be packed)."""
        never = self._cap_cache.get(job.fkey + job.shape.k * 1_000_003)
        if never is None and job.shape.mode == "share":
            live = [s.node for s in self.ledger.slots if s.alive]
            never = inventory_misfit(live, job.cls, job.spec, job.shape.ckey, self.rules.mig_reconfigure) is not None
            self._cap_cache[job.fkey + job.shape.k * 1_000_003] = never
        if never is None:
            ledger = self.ledger
            cand = members_of(ledger, self.groups_for(job))
            totals = {i: ledger.slots[i].healthy for i in cand}
            never = place_counts(dict(totals), cand, totals, job.shape) is None
            self._cap_cache[job.fkey + job.shape.k * 1_000_003] = never
        return never

    def _capacity_detail(self, job: Job) -> str:
        text = describe(job.cls, job.spec)
        if job.shape.mode == "single" and job.spec.same_node:
            text += ",same_node"
        return text

    def _share_reason(self, job: Job) -> PendingReason:
        """Why no card takes a share now: the dimension that binds (the conventions'
        ``insufficient_gpu_memory``, ``insufficient_gpu_fraction``,
        ``no_free_mig_slice``, ``no_free_mps_replica``)."""
        share = job.share
        ledger = self.ledger
        groups = self.groups_for(job)
        if share.kind == "mig":
            nodes = self.nodes_for(job)
            coming = [f"{ledger.slots[i].node.name}:{g}" for (i, g), layout in sorted(self._mig_plans.items())
                      if i in nodes and any(p == share.profile for _s, p in layout)]
            if coming:
                return PendingReason(R.NO_FIT, f"mig-slice {share.profile}, reconfiguring {','.join(coming)}")
            return PendingReason(R.NO_FIT, f"mig-slice {share.profile}")
        milli, mem, slots = share.need()
        fresh = ledger.free_in([g for g in groups if share_fits_card(ledger.groups[g].node, share)]) > 0
        if fresh:  # a whole GPU is free, but reserved or held for another class
            return PendingReason(R.NO_FIT, "gpu")
        if mem and ledger.best_card(groups, share.kind, milli, 0, slots) is not None:
            return PendingReason(R.NO_FIT, "gpu-memory")
        if share.kind == "time_slice":
            return PendingReason(R.NO_FIT, "time-slice-replica")
        if share.kind == "mps":
            return PendingReason(R.NO_FIT, "mps-client")
        return PendingReason(R.NO_FIT, "gpu-fraction" if milli else "gpu-memory")

    def _capacity_reason(self, job: Job) -> PendingReason:
        ledger = self.ledger
        groups = self.groups_for(job)
        if job.shape.mode == "share":
            return self._share_reason(job)
        free_here = ledger.free_in(groups)
        if (self.rules.preemption_enabled and self._has_lower_running(job)
                and self._room(job)
                and not (self._could_preempt(job) and self._victims(job, self.reservations) is not None)):
            # evicting lower-priority work would make room, but not work that may be evicted
            return PendingReason(R.NO_PREEMPTIBLE_VICTIMS, "lower-priority jobs may not be preempted")
        if free_here >= job.shape.k:
            what = {"single": "single-node", "multi": "whole-nodes", "pods": "pods"}[job.shape.mode]
            return PendingReason(R.NO_FIT, what)
        if ledger.free_total >= job.shape.k and len(groups) < len(ledger.groups):
            return PendingReason(R.NO_FIT, self._constraint_names(job))
        if any(ledger.groups[g].node.mig or any(ledger.groups[g].open.values()) for g in groups):
            return PendingReason(R.NO_FIT, "whole-gpu")  # capacity left only as shares or MIG instances
        return PendingReason(R.RESOURCES)

    def _constraint_names(self, job: Job) -> str:
        spec = job.spec
        names = []
        if job.cls.pools is not None:
            names.append("pool")
        if spec.gpu_types:
            names.append("gpu_type")
        if spec.gpu_mem_mib:
            names.append("gpu_memory")
        return "+".join(names) or "constraints"

    def _changed_since(self, pos: int) -> set[int]:
        return set(self.ledger.changes[pos:])

    def _victims(self, job: Job, res: list[backfill.Reservation]):
        """``victims_for`` with a memo of failures: a failed search is repeated only
        when a node it could use changed (single-node shapes re-check just those nodes)
        or a too-young victim passed the minimum runtime. Nodes whose GPUs a reservation
        of a job ahead claims are off limits (a preemptor must not delay it either)."""
        rem = job.remaining_estimate()
        end = self.now + rem if rem is not None else INF
        claimed = frozenset(n for r in res if not (end <= r.start or job.key < r.key) for n in r.claims)
        claimed |= self.avoided_nodes(job)  # it never preempts onto a node it may not use
        key = (job.shape, job.cls.priority, claimed)
        memo = self._victim_memo.get(key)
        only = None
        if memo is not None and self.now < memo[1]:
            changed = self._changed_since(memo[0])
            if not changed:
                return None
            if job.shape.mode == "single":
                only = changed
        pos = len(self.ledger.changes)
        found, until = victims_for(self, job, self.now, only, claimed)
        if found is None:
            self._victim_memo[key] = (pos, until)
            if until != INF and until > self.now and until not in self._wakeups:
                heapq.heappush(self._wakeups, until)
        else:
            self._victim_memo.pop(key, None)
        return found

    def _room(self, job: Job) -> bool:
        """``lower_jobs_would_make_room`` with a memo, as ``_victims``."""
        key = (job.shape, job.cls.priority)
        memo = self._room_memo.get(key)
        pos = len(self.ledger.changes)
        if memo is not None:
            changed = self._changed_since(memo[0])
            if not changed:
                return memo[1]
            if not memo[1] and job.shape.mode == "single":
                result = lower_jobs_would_make_room(self, job, changed)
                self._room_memo[key] = (pos, result)
                return result
        result = lower_jobs_would_make_room(self, job)
        self._room_memo[key] = (pos, result)
        return result

    def _has_lower_running(self, job: Job) -> bool:
        p = job.cls.priority
        return any(q < p for q in self._running_prio)

    def _class_hold(self, job: Job) -> PendingReason | None:
        """GPUs reserved for other classes (``reserved_gpus``) that this job would take."""
        held = 0
        holder = None
        for cls in self.rules.classes.values():
            if cls.reserved_gpus and cls.name != job.cls.name:
                used = self._class_usage(cls.name)
                if used < cls.reserved_gpus * GPU_UNITS:
                    held += cls.reserved_gpus * GPU_UNITS - used
                    holder = holder or cls.name
        if held and self.ledger.free_total * GPU_UNITS - job.units < held:
            return PendingReason(R.RESERVED_FOR, f"classes.{holder}.reserved_gpus")
        return None

    def _class_usage(self, name: str) -> int:
        return self._class_gpus.get(name, 0)

    def _reason_now(self, job: Job) -> PendingReason:
        """The reason of a pending job the last pass did not look at."""
        if job.victims and job.id in self._preemptors:
            return PendingReason(R.PREEMPTION_IN_PROGRESS, ",".join(sorted(job.victims, key=natural_key)))
        hard = self._hard_reason(job)
        if hard is not None:
            return hard
        if job.shape.mode == "share":
            return self._share_reason_now(job)
        counts = self._place_whole(job)
        if counts is None:
            if self.avoided_nodes(job) and place_live(self.ledger, self.groups_for(job), job.shape) is not None:
                return PendingReason(R.NO_FIT, "anti-affinity")
            return self._unmanaged_reason(job) or self._capacity_reason(job)
        short = self._cohort_reason(job)
        if short is not None:
            return short
        held = self._class_hold(job)
        if held is not None:
            return held
        rem = job.remaining_estimate()
        end = self.now + rem if rem is not None else INF
        blocker = (backfill.quota_conflict(self.reservations, job.charges, end, job.key)
                   or backfill.conflict(self.reservations, counts, end, job.key))
        if blocker is not None:
            return PendingReason(R.HELD_FOR_PREEMPTOR if blocker.hold else R.RESERVED_FOR, blocker.job_id)
        return PendingReason(R.PRIORITY, "not reached by the last pass")

    def _cohort_reason(self, job: Job) -> PendingReason | None:
        """``CohortQuota`` when the job's cohort has no quota to spare now."""
        short = self.quota.blocking(job.charges, cohort=True) if job.cohort is not None else None
        if short is None:
            return None
        i, used = short
        quota = self.quota
        return PendingReason(R.COHORT_QUOTA, f"{quota.limits[i].path}={quota.fmt(i, quota.current[i])}, "
                             f"in use {quota.fmt(i, used)}")

    def _share_reason_now(self, job: Job) -> PendingReason:
        short = self._cohort_reason(job)
        if short is not None:
            return short
        rem = job.remaining_estimate()
        end = self.now + rem if rem is not None else INF
        blocker = backfill.quota_conflict(self.reservations, job.charges, end, job.key)
        if blocker is not None:
            return PendingReason(R.HELD_FOR_PREEMPTOR if blocker.hold else R.RESERVED_FOR, blocker.job_id)
        spot = self._place_share(job, self.reservations, end)
        if spot is None:
            if self._place_share(job) is not None:
                blocker = next((r for r in self.reservations if not job.key < r.key), None)
                if blocker is not None:
                    return PendingReason(R.HELD_FOR_PREEMPTOR if blocker.hold else R.RESERVED_FOR, blocker.job_id)
            return self._unmanaged_reason(job) or self._share_reason(job)
        if spot[3]:
            held = self._class_hold(job)
            if held is not None:
                return held
        return PendingReason(R.PRIORITY, "not reached by the last pass")

    # ------------------------------------------------------ state, invariants
    def snapshot(self) -> dict:
        """The scheduler's state as plain data (JSON-serialisable).

        Only jobs are saved - specs, states, placements, banked work - and the health
        of GPUs; the ledger and usage counters are rebuilt from the live jobs on
        ``restore`` (so a restart cannot resurrect a stale allocation).
        """
        jobs = []
        for job in sorted(self.jobs.values(), key=lambda j: j.seq):
            spec = job.spec
            jobs.append({
                "spec": {f: (asdict(spec.share) if f == "share" and spec.share is not None else getattr(spec, f))
                         for f in spec.__dataclass_fields__},
                "share_at": list(job.share_at),
                "state": job.state.value,
                "alloc": [[self.ledger.slots[i].node.name, list(bits(m))] for i, m in job.alloc],
                "run_start": job.run_start,
                "first_start": job.first_start,
                "runs": job.runs,
                "preemptions": job.preemptions,
                "done_s": job.done_s,
                "signal_t": job.signal_t,
                "preemptor": job.preemptor,
                "victims": sorted(job.victims),
                "plan": [[self.ledger.slots[i].node.name, c] for i, c in job.plan],
                "score": -job.key[0],
                "reclaim": job.reclaim,
                "estimate_s": job.estimate_s,
                "deadline_flags": [list(f) for f in job.deadline_flags],
                "stop_reason": job.stop_reason,
                "usage": self._tracks[job.id].to_dict() if job.id in self._tracks else None,
            })
        unhealthy = []
        lost = []
        for slot in self.ledger.slots:
            if not slot.alive:
                lost.append(slot.node.name)
                continue
            for g in range(slot.total):
                if g in slot.migs:
                    if not slot.migs[g].healthy:
                        unhealthy.append([slot.node.name, g])
                elif slot.sick_mask >> g & 1:
                    unhealthy.append([slot.node.name, g])
        static = {n.name: n for n in self.rules.nodes}
        added = [
            {f: ([[g, [[i.start, i.profile] for i in layout]] for g, layout in s.node.mig] if f == "mig"
                 else getattr(s.node, f)) for f in s.node.__dataclass_fields__}
            for s in self.ledger.slots if static.get(s.node.name) != s.node  # added, or re-added as another node
        ]
        mig = []
        for slot in self.ledger.slots:
            for g in sorted(slot.migs):
                card = slot.migs[g]
                static = dict(slot.node.mig).get(g)
                if card.layout != static or card.reconfiguring:
                    plan = self._mig_plans.get((slot.idx, g))
                    mig.append([slot.node.name, g, [[i.start, i.profile] for i in card.layout],
                                [list(x) for x in plan] if plan is not None else None])
        return {"now": self.now, "jobs": jobs, "unhealthy": unhealthy, "lost_nodes": lost, "added_nodes": added,
                "unmanaged": [list(x) for x in self.unmanaged_gpus()],
                "mig": mig,
                "usage": self.usage.snapshot(self.now) if self.now != float("-inf") else [],
                "priority_recalc": [self._recalc_t, self._next_recalc],
                "predictor": self.predictor.snapshot() if self.predictor is not None else []}

    @classmethod
    def restore(cls, rules: Rules, snap: dict) -> "Scheduler":
        """Rebuild a scheduler from ``snapshot()`` data under ``rules``.

        Raises:
            ValueError: the snapshot's allocations collide (a GPU given twice) or name
                GPUs that do not exist.
        """
        sched = cls(rules)
        for raw in snap.get("added_nodes", []):
            node = Node(**{**raw, "labels": tuple(tuple(x) for x in raw.get("labels", ())),
                           "nvlink_islands": tuple(tuple(x) for x in raw.get("nvlink_islands", ())),
                           **{f: tuple(raw.get(f, ())) for f in ("gpu_uuids", "taints", "cached")},
                           "mig": tuple((g, tuple(MigInstance(start, prof) for start, prof in layout))
                                        for g, layout in raw.get("mig", ()))})
            if node.name in sched.ledger.by_name:  # a policy node that came back as another
                sched.ledger.remove_node(sched.ledger.by_name[node.name])
            sched.ledger.add_node(node)
        for name in snap.get("lost_nodes", []):
            if name in sched.ledger.by_name:
                sched.ledger.remove_node(sched.ledger.by_name[name])
        for name, g in snap.get("unhealthy", []):
            sched.ledger.set_gpu_health(sched.ledger.by_name[name], g, False)
        for name, g, layout, plan in snap.get("mig", []):
            idx = sched.ledger.by_name[name]
            sched.ledger.reconfigure_mig(idx, g, tuple(MigInstance(s, p) for s, p in layout))
            if plan is not None:
                sched.ledger.begin_reconfigure(idx, g)
                sched._mig_plans[(idx, g)] = tuple((int(s), str(p)) for s, p in plan)
        sched.now = snap.get("now", float("-inf"))
        if sched.now != float("-inf"):
            sched.quota.set_time(sched.now)
            sched.usage.restore(snap.get("usage", []), sched.now)
        sched._recalc_t, sched._next_recalc = snap.get("priority_recalc", [float("-inf"), float("-inf")])
        if sched.predictor is not None:
            sched.predictor.restore(snap.get("predictor", []))
        for raw in snap["jobs"]:
            spec_raw = dict(raw["spec"])
            spec_raw["gpu_types"] = tuple(spec_raw.get("gpu_types", ()))
            spec_raw["node_selector"] = tuple(tuple(x) for x in spec_raw.get("node_selector", ()))
            spec_raw["tolerations"] = tuple(spec_raw.get("tolerations", ()))
            if spec_raw.get("share") is not None:
                spec_raw["share"] = GpuShare(**spec_raw["share"])
            spec = JobSpec(**spec_raw)
            job = sched._make_job(spec)
            sched.jobs[spec.id] = job
            job.runs = raw["runs"]
            job.first_start = raw["first_start"]
            job.preemptions = raw["preemptions"]
            job.done_s = raw["done_s"]
            job.signal_t = raw["signal_t"]
            job.preemptor = raw["preemptor"]
            job.victims = set(raw["victims"])
            job.plan = [(sched.ledger.by_name[n], c) for n, c in raw["plan"]]
            job.reclaim = bool(raw.get("reclaim", False))
            if "estimate_s" in raw:  # the estimate it was given at submit (a prediction may differ now)
                job.estimate_s = raw["estimate_s"]
            job.deadline_flags = [(float(t), str(stage), float(end)) for t, stage, end in raw.get("deadline_flags", [])]
            job.stop_reason = str(raw.get("stop_reason") or "")
            if raw.get("usage") is not None:
                tr = sched._tracks[spec.id] = UsageTrack.from_dict(raw["usage"])
                rule = job.cls.idle_stop
                if (tr.idle_since is not None and rule is not None and tr.run == job.runs
                        and raw["state"] == JobState.RUNNING.value):
                    heapq.heappush(sched._idle_timers, (tr.idle_since + rule.after_s, job.seq, job.runs, spec.id,
                                                        tr.idle_since))
            if "score" in raw:  # the score it was queued with (computed at submit or the last recalc)
                job.key = (-float(raw["score"]), spec.submit_time, natural_key(spec.id))
            state = JobState(raw["state"])
            job.history.append(Transition(sched.now, "", state.value, "restored", 0))
            if state is JobState.PENDING:
                sched._enqueue(job)
            elif state.holds_gpus:
                alloc = []
                for name, gpus in raw["alloc"]:
                    idx = sched.ledger.by_name.get(name)
                    if idx is None:
                        raise ValueError(f"snapshot: job {spec.id} holds GPUs on unknown node {name}")
                    mask = 0
                    for g in gpus:
                        mask |= 1 << g
                    alloc.append((idx, mask))
                at = tuple(raw.get("share_at", ()))
                if spec.share is not None:
                    if len(alloc) != 1 or not at:
                        raise ValueError(f"snapshot: share job {spec.id} without its card")
                    if len(at) == 1:
                        sched.ledger.allocate_share(spec.id, alloc[0][0], at[0], spec.share.kind, spec.share.need())
                    else:
                        sched.ledger.allocate_mig(spec.id, alloc[0][0], at[0], at[1])
                    job.share_at = at
                sched._occupy(job, alloc, raw["run_start"], state)
            else:
                job.state = state
        for job in sched._queue:
            if job.victims:
                sched._preemptors[job.id] = job
        for name, g in snap.get("unmanaged", []):  # after the jobs: those holding them keep them
            sched.ledger.set_gpu_unmanaged(sched.ledger.by_name[name], g, True)
            sched._any_unmanaged = True
        sched._full = True
        sched.check_invariants()
        return sched

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` when the core's state is inconsistent (dask's
        ``validate_state``). Property tests call it after every event.

        Checks: the ledger's own invariants; every GPU is held by at most one job and
        exactly the GPUs its job records; usage counters equal the sums over jobs that
        hold GPUs, never negative; the pending queue is sorted and holds exactly the
        pending jobs.
        """
        self.ledger.check()
        held: dict[tuple[int, int], str] = {}
        expect_usage: dict[tuple[int, str], int] = {}
        for job in self.jobs.values():
            if job.state.holds_gpus:
                assert job.id in self._running, f"{job.id} holds GPUs but is not in the running set"
                if job.share is not None:
                    (idx, mask), = job.alloc
                    slot = self.ledger.slots[idx]
                    assert mask == 0 and job.share_at, f"{job.id}: a share holding whole GPUs"
                    if len(job.share_at) == 1:
                        card = slot.cards.get(job.share_at[0])
                        assert not slot.alive or (card is not None and job.id in card.holders), f"{job.id}: share lost"
                    else:
                        assert slot.migs[job.share_at[0]].holders[job.share_at[1]] == job.id, f"{job.id}: MIG lost"
                else:
                    assert sum(m.bit_count() for _, m in job.alloc) == job.gpus, f"{job.id}: wrong GPU count"
                for idx, mask in job.alloc:
                    for g in bits(mask):
                        assert (idx, g) not in held, f"GPU {idx}:{g} given to {held.get((idx, g))} and {job.id}"
                        held[(idx, g)] = job.id
                        assert self.ledger.slots[idx].holder[g] == job.id
                for i, user, amount in job.charges:
                    expect_usage[(i, user)] = expect_usage.get((i, user), 0) + amount
            else:
                assert not job.alloc, f"{job.id} is {job.state.value} but holds GPUs"
                assert job.id not in self._running
        for slot in self.ledger.slots:
            for g, h in enumerate(slot.holder):
                if h is not None and h not in (SHARED, MIG):
                    assert held.get((slot.idx, g)) == h, f"ledger says {slot.node.name}:{g} is {h}'s"
            for g, card in slot.cards.items():
                for h in card.holders:
                    assert self.jobs[h].state.holds_gpus and self.jobs[h].share_at == (g,), f"stale share {h}"
            for g, mig in slot.migs.items():
                for pos, h in enumerate(mig.holders):
                    assert h is None or self.jobs[h].share_at == (g, pos), f"stale MIG holder {h}"
        assert {k: v for k, v in self.quota.usage.items() if v} == expect_usage, "usage counters drifted"
        assert all(v > 0 for v in self.quota.usage.values()), "negative usage"
        self._queue.check()
        pend = {j.id for j in self.jobs.values() if j.state is JobState.PENDING}
        assert pend == {j.id for j in self._queue}, "pending set drifted"
        assert set(self._preemptors) <= pend, "a preemptor that is not pending"
        for (idx, g) in self._mig_plans:
            assert self.ledger.slots[idx].migs[g].reconfiguring, "a MIG plan on a GPU in service"

        assert len(self._ends) == len(self._running)
        for job in self._running.values():
            assert job.state.holds_gpus
        counts: dict[int, int] = {}
        allc: dict[int, int] = {}
        gpus: dict[str, int] = {}
        for job in self._running.values():
            gpus[job.cls.name] = gpus.get(job.cls.name, 0) + job.units
            if job.state is JobState.RUNNING:
                allc[job.cls.priority] = allc.get(job.cls.priority, 0) + 1
                if job.preemptible and job.share is None:
                    counts[job.cls.priority] = counts.get(job.cls.priority, 0) + 1
        assert counts == {p: len(js) for p, js in self._preemptible.items()}, "preemptible index drifted"
        assert allc == self._running_prio, "running counters drifted"
        assert gpus == self._class_gpus, "class GPU counters drifted"
        n = len(self._prios)
        lower_all = [[0] * n for _ in self._lower_all]
        lower_vic = [[0] * n for _ in self._lower_vic]
        for job in self._running.values():
            if job.state is JobState.RUNNING:
                victim = job.preemptible and not (job.cls.preempt_only_if_checkpointable and not job.checkpointable)
                for idx, mask in job.alloc:
                    for j, q in enumerate(self._prios):
                        if job.cls.priority < q:
                            lower_all[idx][j] += mask.bit_count()
                            if victim:
                                lower_vic[idx][j] += mask.bit_count()
        assert lower_all == self._lower_all and lower_vic == self._lower_vic, "per-node class counters drifted"


def _fits_layout(gpu_type: str, names: list[str]) -> bool:
    try:
        layout_from_names(gpu_type, names)
    except MigError:
        return False
    return True


def _time_limit(spec: JobSpec, cls) -> float | None:
    """Seconds a job may run: its own limit, else the class default, else the class's
    max runtime; never above the class's max runtime (``None``: no limit)."""
    limit = spec.time_limit_s or cls.default_time_limit_s or cls.max_runtime_s
    if limit is not None and cls.max_runtime_s is not None:
        limit = min(limit, cls.max_runtime_s)
    return limit


def spec_with(spec: JobSpec, **changes) -> JobSpec:
    """A copy of ``spec`` with ``changes`` (a small helper for drivers and tests)."""
    return replace(spec, **changes)

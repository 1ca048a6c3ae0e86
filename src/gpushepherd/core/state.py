"""The core's record of one job (mutable, owned by the scheduler)."""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter

from gpushepherd.core.placement import Shape
from gpushepherd.core.quota import Charge
from gpushepherd.model.job import JobSpec, JobState
from gpushepherd.model.reasons import PendingReason, ReasonCode
from gpushepherd.model.rules import ClassRules

INF = float("inf")


@dataclass(frozen=True, slots=True)
class Transition:
    """One line of a job's history (dask's "story"): what happened and why."""

    t: float
    from_state: str
    to_state: str
    reason: str
    event: int  # sequence number of the event that caused it (0: the scheduling pass)


@dataclass(slots=True, eq=False)
class Job:
    """A job as the core tracks it.

    Times are seconds on the scheduler's axis. ``done_s`` is the work a checkpointable
    job has banked over earlier runs (its remaining estimate and time limit shrink by
    it); a job that does not checkpoint restarts from zero.
    """

    spec: JobSpec
    seq: int
    cls: ClassRules
    key: tuple
    shape: Shape
    charges: tuple[Charge, ...]
    preemptible: bool
    checkpointable: bool
    estimate_s: float | None
    time_limit_s: float | None
    state: JobState = JobState.PENDING
    reason: PendingReason = PendingReason(ReasonCode.NEW)
    reason_pass: int = -1
    alloc: list[tuple[int, int]] = field(default_factory=list)  # [(node index, GPU mask)]
    run_start: float = 0.0
    first_start: float | None = None
    runs: int = 0
    preemptions: int = 0
    done_s: float = 0.0
    signal_t: float | None = None
    end_est: float = INF
    preemptor: str | None = None  # while PREEMPTING: the job the GPUs are freed for
    victims: set[str] = field(default_factory=set)  # while waiting for its victims to exit
    plan: list[tuple[int, int]] = field(default_factory=list)  # counts the victims free, per node
    history: list[Transition] = field(default_factory=list)
    vkey: tuple = ()  # victim order key of the current run (set when it starts)
    sig: int = -1  # sub-queue signature (shape, class, charges, estimate band, strict queue)
    strict_q: tuple | None = None  # its strict FIFO queue (``Rules.strict_queue``), if any
    fkey: int = -1  # id of (node filter, layout mode, pod size): placement memos key on it
    pend_est: float = INF  # remaining estimate while pending (INF: none)
    #: deadline flags: (time, "submit" | "start", earliest end by the estimate)
    deadline_flags: list[tuple[float, str, float]] = field(default_factory=list)
    reclaim: bool = False  # its victims were taken by reclaim (they may be queued ahead of it)
    cohort: tuple | None = None  # (Cohort, CohortMember) of the job's team, if any
    units: int = 0  # GPU units (7000 per GPU) it counts against quotas
    share_at: tuple[int, ...] = ()  # a share's (GPU,) or MIG (GPU, instance position) on alloc's node
    #: why the core stopped its current run (``time-limit``, ``idle``, ``memory-overrun``; a
    #: preemption: its ``Preempt`` decision's reason, ``priority:<class>``, ``reclaim``,
    #: ``window-closed:<limit>``; '' none)
    stop_reason: str = ""
    #: the job its current run is being preempted for ('' none, or a window closing), kept
    #: after the preemptor lets it go (``preemptor`` is then ``None``): for its reason
    preempted_by: str = ""
    #: it may be evicted: preemptible, and checkpointable where its class asks
    evictable: bool = False
    #: the grace period its stops get (its class's, when it checkpoints; else 0), seconds
    stop_grace: float = 0.0
    #: what the current run is charged: units (7000 per GPU) and quota charges (a memory
    #: share is charged by the card it holds; a reserved class's covered part is not
    #: charged to cohort limits)
    run_units: int = 0
    run_charges: tuple[Charge, ...] = ()
    #: units of the current run covered by its class's ``reserved_gpus`` (note 015)
    covered: int = 0
    #: the current run's place in the order runs started (``Book.start_seq``)
    start_no: int = 0
    #: while it holds a preemptor's hold: the pass number that last kept it
    hold_pass: int = -1
    #: a preemptor's planned GPUs per node (masks): it starts on them when they are free
    hold_gpus: dict[int, int] = field(default_factory=dict)
    #: its reservation in the pass is for a hard limit now (``Claim.lend``)
    lend: bool = False
    #: quotas per GPU type (note 038, ``typed.py``): one ``Variant`` per GPU type it may
    #: run on, when some per-type limit counts it (else empty); its base (every type);
    #: the variant its last turn was decided on (``-1``: none)
    variants: tuple = ()
    base: object = None
    tv: int = -1
    #: the spec's id, kept as a field: read millions of times a replay (a property cost
    #: a call each; an update after submit never changes it, note 039)
    id: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self.id = self.spec.id

    def __deepcopy__(self, memo: dict) -> "Job":
        """A copy for ``forward.clone`` (note 062): the containers a job changes in place
        (``CONTAINERS``) are copied one level deep - their items are immutable - through
        ``memo`` (an alias elsewhere stays one object); every other field holds an
        immutable value (``SHARED``: atoms, enums, tuples of atoms, frozen dataclasses,
        the compiled rules; a change assigns a new value) and is shared, not copied."""
        new = object.__new__(Job)
        for name, value in zip(_FIELDS, _get_fields(self)):
            if name in CONTAINERS:
                kept = memo.get(id(value))
                if kept is None:
                    kept = memo[id(value)] = value.copy()
                value = kept
            setattr(new, name, value)
        return new

    @property
    def gpus(self) -> int:
        return self.spec.gpus

    @property
    def share(self):
        return self.spec.share

    @property
    def fraction(self) -> float:
        """GPUs it holds for usage accounting (a share: its fraction of one GPU)."""
        return self.units / 7000

    def remaining_estimate(self) -> float | None:
        if self.estimate_s is None:
            return None
        return max(0.0, self.estimate_s - self.done_s)

    def planned_run(self) -> float:
        """Seconds a run started now is planned to last (note 015): its remaining
        estimate when that ends before its time limit, else the time limit plus the
        grace its time-limit stop gets; ``INF`` without either."""
        rem = self.remaining_estimate()
        lim = self.run_limit()
        if lim is None:
            return INF if rem is None else rem
        if rem is not None and rem < lim:
            return rem
        return lim + self.stop_grace

    def run_limit(self) -> float | None:
        """Seconds this run may last before its time limit stops it."""
        if self.time_limit_s is None:
            return None
        return max(0.0, self.time_limit_s - self.done_s)


#: ``Job`` fields that hold a container changed in place (a list, set or dict of
#: immutable items: ``(node, mask)`` and ``(node, count)`` tuples, job ids, GPU masks,
#: ``Transition``s, deadline-flag tuples): a copy copies them one level deep
CONTAINERS = frozenset({"alloc", "victims", "plan", "history", "deadline_flags", "hold_gpus"})
#: every other ``Job`` field: immutable values only, shared by a copy (``Job.__deepcopy__``;
#: note 062 lists where each is assigned - always a new value, never changed in place)
SHARED = frozenset({
    "spec", "seq", "cls", "key", "shape", "charges", "preemptible", "checkpointable", "estimate_s",
    "time_limit_s", "state", "reason", "reason_pass", "run_start", "first_start", "runs", "preemptions",
    "done_s", "signal_t", "end_est", "preemptor", "vkey", "sig", "strict_q", "fkey", "pend_est", "reclaim",
    "cohort", "units", "share_at", "stop_reason", "preempted_by", "evictable", "stop_grace", "run_units",
    "run_charges", "covered", "start_no", "hold_pass", "lend", "variants", "base", "tv", "id"})
_FIELDS = Job.__slots__
assert set(_FIELDS) == CONTAINERS | SHARED and not CONTAINERS & SHARED, "every Job field is a container or shared"
_get_fields = attrgetter(*_FIELDS)

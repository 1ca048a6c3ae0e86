"""The core's record of one job (mutable, owned by the scheduler)."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    sig: int = -1  # sub-queue signature (shape, class, charges, estimate band)
    fkey: int = -1  # id of (node filter, layout mode, pod size): placement memos key on it
    pend_est: float = INF  # remaining estimate while pending (INF: none)
    #: deadline flags: (time, "submit" | "start", earliest end by the estimate)
    deadline_flags: list[tuple[float, str, float]] = field(default_factory=list)
    reclaim: bool = False  # its victims were taken by reclaim (they may be queued ahead of it)
    cohort: tuple | None = None  # (Cohort, CohortMember) of the job's team, if any
    units: int = 0  # GPU units (7000 per GPU) it counts against quotas
    share_at: tuple[int, ...] = ()  # a share's (GPU,) or MIG (GPU, instance position) on alloc's node
    #: why the core stopped its current run (``time-limit``, ``idle``, ``memory-overrun``; '' none)
    stop_reason: str = ""

    @property
    def id(self) -> str:
        return self.spec.id

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

    def run_limit(self) -> float | None:
        """Seconds this run may last before its time limit stops it."""
        if self.time_limit_s is None:
            return None
        return max(0.0, self.time_limit_s - self.done_s)

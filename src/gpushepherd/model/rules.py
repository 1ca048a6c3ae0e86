"""The compiled policy: what the core reads. Built by ``gpushepherd.policy`` from a
validated policy file; plain frozen data, no validation logic here."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import lru_cache

from gpushepherd.model.clock import Clock, Window
from gpushepherd.model.cluster import Node

#: a limit that is not set (outside its windows)
UNLIMITED = 10**12


@dataclass(frozen=True, slots=True)
class IdleStop:
    """Idle auto-stop of a class's jobs (R16, note 009): a run whose GPU utilisation
    samples stay below ``below_util_pct`` (percent, 0-100) for ``after_s`` seconds is
    stopped; its first ``setup_s`` seconds count as activity."""

    below_util_pct: float
    after_s: float
    setup_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ClassRules:
    """A workload class with every default resolved (R1)."""

    name: str
    priority: int
    preemptible: bool
    checkpointable: bool
    preempt_only_if_checkpointable: bool
    max_runtime_s: float | None
    default_time_limit_s: float | None
    grace_period_s: float
    pools: tuple[str, ...] | None
    reserved_gpus: int = 0
    on_window_close: str = "drain"  # or "checkpoint-and-stop"
    #: the kinds of GPU its jobs may take (``whole``, ``fraction``, ``time_slice``,
    #: ``mps``, ``mig``); ``None``: any
    sharing: tuple[str, ...] | None = None
    #: classes whose running jobs keep this class off a node (symmetric: compiled
    #: from both sides' ``avoid_nodes_with``)
    avoid: frozenset[str] = frozenset()
    #: idle auto-stop (``None``: never stopped for idleness)
    idle_stop: IdleStop | None = None
    #: peak GPU memory over the declaration: ``warn`` (flag only) or ``stop`` (on a
    #: shared card only; a whole GPU or MIG instance is only flagged)
    memory_overrun: str = "warn"
    #: the signal sent first when a job is preempted or stopped (then SIGKILL after
    #: the grace period): a name such as ``SIGTERM``
    stop_signal: str = "SIGTERM"
    #: ``queueing: strict_fifo``: the class is one strict FIFO queue (note 031)
    strict_fifo: bool = False
    #: ``require_island``: a multi-GPU single-node job of the class must fit one NVLink
    #: island (a job may say otherwise; note 037)
    require_island: bool = False

    def reserved_within(self, nodes) -> int:
        """The GPUs its ``reserved_gpus`` keep from other classes on ``nodes`` (``Node``
        objects, lost ones included: they may come back): at most the GPUs of those its
        pools allow - a reservation holds what the class can use (a Slurm reservation's
        nodes lie in one partition; design note 069)."""
        if not self.reserved_gpus:
            return 0
        return min(self.reserved_gpus, sum(n.gpus for n in nodes if self.pools is None or n.pool in self.pools))


class LimitUnit(str, enum.Enum):
    GPUS = "gpus"
    JOBS = "jobs"


@dataclass(frozen=True, slots=True)
class Limit:
    """A cap on what a set of running jobs may hold at once.

    A job is counted by the limit when its team is ``team`` or a descendant of it
    (``None``: any team) and its class is ``workload_class`` (``None``: any class).
    With ``per_user`` each user is capped separately. ``path`` is the policy field the
    limit comes from (``teams.ml.max_gpus``) and is what a pending reason names.
    ``windows``: ``(window, max)`` pairs; the first open window gives the limit, else
    ``max``.
    """

    path: str
    max: int
    unit: LimitUnit = LimitUnit.GPUS
    team: str | None = None
    workload_class: str | None = None
    per_user: bool = False
    windows: tuple[tuple[Window, int], ...] = ()
    #: a cohort's capacity limit: counts the jobs of these teams (and their descendants)
    members: tuple[str, ...] = ()
    cohort: str = ""
    #: counts only jobs whose class may run in these pools alone (``None``: any job)
    pools: tuple[str, ...] | None = None
    #: counts only jobs that may not be preempted (they could never be reclaimed)
    unevictable_only: bool = False
    #: compiled from a cohort: the part of a job covered by its class's
    #: ``reserved_gpus`` does not count here (the reserved GPUs are outside every
    #: nominal quota, so they are counted once; note 015)
    covers_reserved: bool = False
    #: counts only the GPUs of jobs placed on this GPU type (a per-type quota, note 038;
    #: ``None``: every type)
    gpu_type: str | None = None

    @property
    def loosest(self) -> int:
        """The largest value the limit takes at some time of the week: a window's value
        where it is the first open window, ``max`` where none is open (windows that
        cover the whole week leave ``max`` unused: a job over every value that applies
        can never start, and nothing should wake for it)."""
        if not self.windows:
            return self.max
        return max(v for (v,) in week_values((self,)))

    def at(self, clock: Clock | None, t: float) -> tuple[int, str]:
        """The limit at scheduler time ``t`` and the name of the window giving it ('' outside)."""
        if not self.windows or clock is None:
            return self.max, ""
        weekday, second = clock.local(t)
        for window, value in self.windows:
            if window.open_at(weekday, second):
                return value, window.name
        return self.max, ""


@lru_cache(maxsize=4096)
def week_values(limits: tuple["Limit", ...]) -> frozenset[tuple[int, ...]]:
    """The combinations of values that ``limits`` take together on some stretch of the
    local week (one value per limit, in order), found on the week cut at every edge of
    their windows (local readings as ``Clock.local`` gives them)."""
    week = 7 * 86400.0
    cuts = {0.0}
    for lim in limits:
        for window, _m in lim.windows:
            for d in window.days:
                for edge in (window.start, window.end):
                    cuts.add((d * 86400.0 + edge) % week)
    found = set()
    for at in sorted(cuts):
        weekday, second = divmod(at, 86400.0)
        found.add(tuple(next((m for w, m in lim.windows if w.open_at(int(weekday), second)), lim.max)
                        for lim in limits))
    return frozenset(found)


@dataclass(frozen=True, slots=True)
class CohortMember:
    """A team of a cohort: its nominal quota and the index of the limit that counts
    all its GPUs (``teams.T.borrowing_limit``, unlimited when no limit is set)."""

    team: str
    nominal: int
    limit: int


@dataclass(frozen=True, slots=True)
class Cohort:
    """Teams that lend each other idle nominal quota (Kueue's cohort).

    ``reclaim``: ``any`` - a member within its nominal quota may preempt borrowers of
    any class; ``lower_priority`` - only of lower classes; ``never``.
    """

    name: str
    members: tuple[CohortMember, ...]
    reclaim: str = "any"
    pools: tuple[str, ...] | None = None  # the pool its quota is for (None: all)
    #: the GPU type its quota is for (a cohort of per-type quotas is one ``Cohort`` per
    #: type, note 038; ``None``: every type)
    gpu_type: str | None = None

    def covers(self, class_pools: tuple[str, ...] | None) -> bool:
        """Whether jobs of a class allowed ``class_pools`` count in this cohort."""
        return self.pools is None or (class_pools is not None and set(class_pools) <= set(self.pools))

    def member(self, chain: tuple[str, ...]) -> CohortMember | None:
        """The member a team (given as itself and its ancestors) belongs to."""
        for m in self.members:
            if m.team in chain:
                return m
        return None


@dataclass(frozen=True, slots=True)
class PriorityRules:
    """Multifactor priority (Slurm's priority/multifactor) and fair-share settings.

    ``score = class_weight * class + fair_share_weight * F + age_weight * age +
    size_weight * size + time_limit_weight * short + deadline_weight * urgency``, each
    factor in [0, 1]; ``short`` =
    ``1 - time limit / max_time_limit_s`` (shortest-limit-first, as PBS's walltime sort;
    the limit the user gave, or a runtime prediction when the job carries one - never
    the true duration); recomputed every ``recalc_s``.
    """

    class_weight: float = 1_000_000.0
    fair_share_weight: float = 0.0
    age_weight: float = 0.0
    size_weight: float = 0.0
    time_limit_weight: float = 0.0
    max_time_limit_s: float = 7 * 86400.0
    max_age_s: float = 7 * 86400.0
    recalc_s: float = 300.0
    half_life_s: float = 7 * 86400.0
    fair_share_level: str = "team"  # or "user"
    #: least-slack-first for jobs at risk of missing their deadline (note 034)
    deadline_weight: float = 0.0
    deadline_horizon_s: float = 86400.0
    #: jobs of the top class are ordered before all others, whatever their scores (a
    #: hard tier, as Slurm's partition ``PriorityTier``; note 045)
    top_class_tier: bool = False
    #: a job that has waited this long (at the last recalculation) is ordered before
    #: every job that has not, below the top class, the oldest first (note 053)
    age_tier_s: float | None = None
    #: at most this many aged jobs, the oldest, are promoted into that tier (None: all)
    age_tier_jobs: int | None = None

    @property
    def dynamic(self) -> bool:
        """Whether scores or tiers change with time (and need recalculating)."""
        return (self.fair_share_weight > 0 or self.age_weight > 0 or self.deadline_weight > 0
                or self.age_tier_s is not None)


@dataclass(frozen=True, slots=True)
class PredictionRules:
    """Runtime prediction from finished jobs (``gpushepherd.core.predict``)."""

    enabled: bool = False
    quantile: float = 0.9
    history: int = 20
    min_jobs: int = 3


@dataclass(frozen=True, slots=True)
class Pricing:
    """Price per GPU-hour by GPU type (``policy: pricing``, note 010); the scheduling
    core never reads it, the report does."""

    currency: str
    gpu_hour: tuple[tuple[str, float], ...]  # (GPU type, price), sorted by type
    default: float | None = None

    def price(self, gpu_type: str) -> float:
        """Price of one GPU-hour of ``gpu_type`` (the ``default`` when not named).

        Raises:
            KeyError: a type without a price and no default (a compiled policy never
                has one: every type of its cluster is priced).
        """
        for name, value in self.gpu_hour:
            if name == gpu_type:
                return value
        if self.default is None:
            raise KeyError(f"pricing.gpu_hour: no price for GPU type {gpu_type!r} and no default")
        return self.default


@dataclass(frozen=True, slots=True)
class Rules:
    """Everything the scheduling core needs from the policy."""

    nodes: tuple[Node, ...]
    classes: dict[str, ClassRules]
    teams: dict[str, str | None] = field(default_factory=dict)  # team -> parent
    nominal_gpus: dict[str, int] = field(default_factory=dict)
    shares: dict[str, int] = field(default_factory=dict)  # team -> fair-share shares
    limits: tuple[Limit, ...] = ()
    preemption_enabled: bool = True
    preemption_min_runtime_s: float = 0.0
    backfill_enabled: bool = True
    backfill_reservations: int = 1
    backfill_max_job_test: int = 1000
    #: re-partition idle MIG GPUs for the pending mix; the driver takes this long
    mig_reconfigure: bool = False
    mig_reconfigure_delay_s: float = 60.0
    default_team: str | None = None
    clock: Clock | None = None
    priority: PriorityRules = field(default_factory=PriorityRules)
    cohorts: dict[str, Cohort] = field(default_factory=dict)
    prediction: PredictionRules = field(default_factory=PredictionRules)
    pricing: Pricing | None = None
    #: ``(team, class)`` queues that are strict FIFO by ``teams.T.classes.C.queueing``
    strict_queues: frozenset[tuple[str, str]] = frozenset()
    #: teams whose limits a job may preempt lower-class jobs of the team for
    #: (``teams.T.preemption.within_team: lower_priority``, note 035)
    within_team: frozenset[str] = frozenset()
    #: the cluster's GPU types in the order nodes first name them: the order a job that
    #: may run on several types tries them when per-type quotas apply (note 038)
    gpu_types: tuple[str, ...] = ()
    #: some limit is per GPU type
    typed: bool = False
    #: a team's ``nominal_gpus`` per GPU type, where it is given so (``nominal_gpus``
    #: holds the sum)
    nominal_by_type: dict[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    #: team -> the workload classes it may submit (``teams.T.allowed_classes``; a team
    #: not here: any class). Checked at submit (``gpushepherd.model.access``), not by
    #: the core's admission rule: a job of another class is never queued
    allowed_classes: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def cohort_of(self, team: str, class_pools: tuple[str, ...] | None = None,
                  gpu_type: str | None = None) -> tuple[Cohort, CohortMember] | None:
        """The cohort a job of ``team`` (through itself or an ancestor) whose class may
        run in ``class_pools`` counts in, and its member; a pool's cohort first. A
        cohort of per-type quotas counts only a job placed on its type (``gpu_type``)."""
        chain = self.ancestors(team)
        found = None
        for cohort in self.cohorts.values():
            if not cohort.covers(class_pools) or (cohort.gpu_type is not None and cohort.gpu_type != gpu_type):
                continue
            m = cohort.member(chain)
            if m is not None and (found is None or (found[0].pools is None and cohort.pools is not None)):
                found = (cohort, m)
        return found

    def strict_queue(self, team: str, cls: str) -> tuple | None:
        """The strict FIFO queue a job of ``team`` and class ``cls`` waits in: the class
        (``("class", cls)``), the team's class (``("team", team, cls)``), or ``None``
        when its queue is best-effort (note 031)."""
        c = self.classes.get(cls)
        if c is not None and c.strict_fifo:
            return ("class", cls)
        if (team, cls) in self.strict_queues:
            return ("team", team, cls)
        return None

    def window_boundaries(self) -> tuple[float, ...]:
        """Seconds of the local day at which some window opens or closes."""
        out = set()
        for lim in self.limits:
            for w, _ in lim.windows:
                out.add(w.start % 86400.0)
                out.add(w.end % 86400.0)
        return tuple(sorted(out))

    def ancestors(self, team: str) -> tuple[str, ...]:
        """``team`` and its parents, nearest first."""
        chain = []
        seen = set()
        cur: str | None = team
        while cur is not None and cur not in seen:
            chain.append(cur)
            seen.add(cur)
            cur = self.teams.get(cur)
        return tuple(chain)

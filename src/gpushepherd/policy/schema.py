"""The policy file's schema (YAML, validated with pydantic v2).

A policy states the cluster (pools, nodes or node groups), the workload classes
(priority, preemptible, checkpointable, max runtime, where they may run, class-wide
limits) and the teams (nominal and max GPUs, per-class and per-user limits, a parent
team). Every model forbids unknown fields, so a typo is an error, never ignored.

The five standard workload classes of requirement R1 exist in every policy with the
defaults below; a policy's ``classes`` entry for one of them overrides only the fields
it names. Numeric priorities follow the public scenario conventions: 400 / 300 / 250 /
200 / 100.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

NonNegInt = Annotated[int, Field(ge=0)]
PosInt = Annotated[int, Field(ge=1)]
PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
#: a weight: finite, >= 0
Weight = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")]


class _Strict(BaseModel):
    # strict: YAML's `true` is no 1 and "8" is no 8 (ints still pass as floats)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class TimeSlicingSpec(_Strict):
    replicas: Annotated[int, Field(ge=1, le=64)]


class MpsSpec(_Strict):
    max_clients: Annotated[int, Field(ge=1, le=48)]


class SharingSpec(_Strict):
    """What the node's non-MIG GPUs allow besides whole-GPU jobs (R10): ``fractions``
    (a compute fraction and/or declared GPU memory, Ray/KAI style; on by default),
    ``time_slicing`` replicas per GPU (NVIDIA device plugin), MPS clients per GPU."""

    fractions: bool = True
    time_slicing: TimeSlicingSpec | None = None
    mps: MpsSpec | None = None


class MigGpuSpec(_Strict):
    """One GPU's MIG mode: ``layout`` lists profile names (``1g.10gb``) of NVIDIA's MIG
    user guide for the node's GPU type; they are placed at valid starts."""

    enabled: bool = True
    layout: list[Annotated[str, Field(min_length=1, max_length=32)]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _layout_only_when_enabled(self) -> "MigGpuSpec":
        if not self.enabled and self.layout:
            raise ValueError("layout is not allowed with enabled: false (a GPU out of MIG mode has no instances)")
        return self


#: ``sharing`` shorthands: ``memory_slices`` / ``fractions`` (the default), ``exclusive``
SHARING_SHORTHANDS = ("memory_slices", "fractions", "exclusive")


class NodeGroupSpec(_Strict):
    """One node (``count`` 1) or ``count`` identical nodes named ``<name>-001 ..``.

    Inventory fields (R11): GPU type and memory, driver / CUDA versions, NVLink
    islands, GPU UUIDs (one node only), taints, cached model/dataset keys, labels; how
    its GPUs may be shared (``sharing``) and which are in MIG mode (``mig``: GPU index
    or ``gN`` -> layout).
    """

    name: Name
    count: Annotated[int, Field(ge=1, le=100_000)] = 1
    gpus: Annotated[int, Field(ge=1, le=256)]
    gpu_type: Name = "generic"
    gpu_mem_mib: Annotated[int, Field(ge=0, le=2**31)] = 0
    pool: Name = "default"
    labels: dict[Name, Annotated[str, Field(strict=False, coerce_numbers_to_str=True)]] = Field(default_factory=dict)
    nvlink_islands: list[list[NonNegInt]] = Field(default_factory=list)
    gpu_uuids: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(default_factory=list)
    driver: Annotated[str, Field(max_length=32, pattern=r"^(\d+(\.\d+)*)?$")] = ""
    cuda: Annotated[str, Field(max_length=32, pattern=r"^(\d+(\.\d+)*)?$")] = ""
    taints: list[Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][^\s]*$")]] = Field(
        default_factory=list)
    cached: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(default_factory=list)
    sharing: SharingSpec = Field(default_factory=SharingSpec)
    mig: dict[Annotated[str, Field(pattern=r"^g?[0-9]+$")], MigGpuSpec] = Field(default_factory=dict)

    @field_validator("mig", mode="before")
    @classmethod
    def _mig_int_keys(cls, value: Any) -> Any:
        if isinstance(value, dict):  # YAML's `0:` is an int key: the same GPU as "0" or "g0"
            return {str(k) if isinstance(k, int) and not isinstance(k, bool) else k: v for k, v in value.items()}
        return value

    @field_validator("sharing", mode="before")
    @classmethod
    def _sharing_shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value not in SHARING_SHORTHANDS:
                raise ValueError(f"one of {', '.join(SHARING_SHORTHANDS)}, or a mapping with fractions, "
                                 "time_slicing: {replicas: N}, mps: {max_clients: N}")
            return {"fractions": value != "exclusive"}
        return value

    @model_validator(mode="after")
    def _inventory_fits_node(self) -> "NodeGroupSpec":
        if self.gpu_uuids and (self.count != 1 or len(self.gpu_uuids) != self.gpus
                               or len(set(self.gpu_uuids)) != self.gpus):
            raise ValueError(f"gpu_uuids: {len(self.gpu_uuids)} UUIDs is not allowed: one distinct UUID per GPU "
                             f"({self.gpus}), on a single node (count 1)")
        seen: dict[int, str] = {}
        for key in self.mig:
            g = int(key.lstrip("g"))
            if g >= self.gpus:
                raise ValueError(f"mig: GPU {key!r} is not allowed: an index 0..{self.gpus - 1} (or g0..g{self.gpus - 1})")
            if g in seen:
                raise ValueError(f"mig: GPU {key!r} is not allowed: GPU {g} is already given as {seen[g]!r}")
            seen[g] = key
        return self

    @model_validator(mode="after")
    def _islands_inside_node(self) -> "NodeGroupSpec":
        seen: set[int] = set()
        for island in self.nvlink_islands:
            for g in island:
                if g >= self.gpus or g in seen:
                    raise ValueError(
                        f"nvlink_islands: GPU index {g} is out of range or repeated; "
                        f"allowed: distinct indices 0..{self.gpus - 1}"
                    )
                seen.add(g)
        return self


HHMM = Annotated[str, Field(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$|^24:00$")]
Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
WINDOW_FIELDS = ("max_gpus", "max_gpus_per_user", "max_running_jobs", "max_running_jobs_per_user")


class WindowSpec(_Strict):
    """A time window in which other limits hold: ``[from, to)`` local time on ``days``
    (``from`` > ``to`` wraps past midnight and belongs to the day it starts)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)

    name: str = ""
    days: list[Weekday] | None = None
    from_: HHMM = Field(default="00:00", alias="from")
    to: HHMM = "24:00"
    max_gpus: NonNegInt | None = None
    max_gpus_per_user: NonNegInt | None = None
    max_running_jobs: NonNegInt | None = None
    max_running_jobs_per_user: NonNegInt | None = None

    @model_validator(mode="after")
    def _sets_a_limit(self) -> "WindowSpec":
        if all(getattr(self, f) is None for f in WINDOW_FIELDS):
            raise ValueError("a window must set at least one of " + ", ".join(WINDOW_FIELDS))
        return self


class ClockSpec(_Strict):
    """How the scheduler's seconds map to local time: ``start`` is the local wall time
    of ``t = 0`` (trace replays; ISO 8601); without it ``t`` is Unix time."""

    timezone: str = "UTC"
    start: str | None = None


class PoolSpec(_Strict):
    name: Name
    description: str = ""


class ClusterSpec(_Strict):
    pools: list[PoolSpec] = Field(default_factory=list)
    nodes: list[NodeGroupSpec] = Field(min_length=1)


class IdleStopSpec(_Strict):
    """Idle auto-stop (R16, note 009): a job whose GPU utilisation samples stay below
    ``below_util_pct`` percent for ``after_s`` seconds is stopped (with the class's
    grace period when it checkpoints); the first ``setup_s`` seconds of each run count
    as activity. A job without samples (no NVML) is never idle."""

    below_util_pct: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] = 5.0
    after_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1800.0
    setup_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 300.0


class ClassSpec(_Strict):
    """A workload class (R1). ``None`` fields inherit the standard class's default.

    ``max_gpus`` caps the GPUs the whole class holds at once (cluster-wide);
    ``max_gpus_per_user`` caps one user's GPUs in the class; ``reserved_gpus`` are
    guaranteed to the class and never lent to other classes (R4's "reserve 2 GPUs for
    production inference"): other classes may use at most the capacity minus the
    unused part of every reservation.
    """

    priority: int | None = None
    preemptible: bool | None = None
    checkpointable: bool | None = None
    #: preempt only jobs of this class that checkpoint (training, R6)
    preempt_only_if_checkpointable: bool | None = None
    max_runtime_s: PosFloat | None = None
    default_time_limit_s: PosFloat | None = None
    grace_period_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    pools: list[Name] | None = None
    max_gpus: NonNegInt | None = None
    max_gpus_per_user: NonNegInt | None = None
    max_running_jobs_per_user: NonNegInt | None = None
    reserved_gpus: NonNegInt | None = None
    #: limits that change with the time of day and week (R4, R8)
    windows: list[WindowSpec] = Field(default_factory=list)
    #: what happens to running jobs over a limit when a window closes
    on_window_close: Literal["drain", "checkpoint-and-stop"] | None = None
    #: the kinds of GPU its jobs may take (R10): e.g. production inference
    #: ``[whole, mig]``, sandbox ``[time_slice, mig]``; unset: any
    sharing: list[Literal["whole", "fraction", "time_slice", "mps", "mig"]] | None = Field(default=None, min_length=1)
    #: anti-affinity (R11): jobs of this class do not start on a node where a job of
    #: one of these classes holds GPUs, nor those on one where this class does
    avoid_nodes_with: list[Name] = Field(default_factory=list)
    #: idle auto-stop (R16); the standard sandbox class has it on (5 %, 1800 s, 300 s
    #: of setup); ``null`` turns it off. Only for preemptible classes.
    idle_stop: IdleStopSpec | None = None
    #: a job whose peak GPU memory exceeds what it declared: ``warn`` (flag it) or
    #: ``stop`` it - on a shared card (fraction, time-slicing, MPS) only; a whole GPU
    #: or MIG instance is only flagged. ``stop`` only for preemptible classes.
    memory_overrun: Literal["warn", "stop"] | None = None
    #: the signal a job of this class gets when it is preempted or stopped (time
    #: limit, window, idle), before SIGKILL at the end of the grace period (Slurm's
    #: ``--signal``, Docker's ``STOPSIGNAL``); default SIGTERM
    stop_signal: Literal["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"] | None = None
    description: str | None = None


#: a ``teams.X.members`` entry: a user name or ``@group`` (POSIX portable names, as useradd takes)
_MEMBER = re.compile(r"@?[A-Za-z0-9_][A-Za-z0-9_.\-]{0,62}\$?")
MAX_MEMBERS = 10_000


def _member(v: str) -> str:
    if not _MEMBER.fullmatch(v):
        raise ValueError("a Unix user name (alice) or @ and a Unix group (@ml-users): letters, digits, _ . - (a "
                         "trailing $ too), 1-64 characters, not starting with - or .")
    return v


Member = Annotated[str, AfterValidator(_member)]


class TeamClassLimit(_Strict):
    max_gpus: NonNegInt | None = None
    max_running_jobs: NonNegInt | None = None


class TeamSpec(_Strict):
    """A team (Slurm account, Kueue ClusterQueue).

    ``nominal_gpus`` is the team's guaranteed share (the sum over teams may not exceed
    the cluster); ``max_gpus`` the most it may hold at once; ``parent`` makes the team
    count against its parent's limits too (hierarchical queues).
    """

    nominal_gpus: NonNegInt | None = None
    max_gpus: NonNegInt | None = None
    #: in a cohort: how many GPUs beyond ``nominal_gpus`` the team may borrow (unset: any)
    borrowing_limit: NonNegInt | None = None
    #: in a cohort: how much of ``nominal_gpus`` others may borrow (unset: all of it)
    lending_limit: NonNegInt | None = None
    #: the team's relative weight (Slurm's ``Fairshare=`` shares); the trace mapping
    #: spreads mapped jobs over teams by it
    shares: PosInt | None = None
    max_gpus_per_user: NonNegInt | None = None
    max_running_jobs: NonNegInt | None = None
    max_running_jobs_per_user: NonNegInt | None = None
    parent: Name | None = None
    classes: dict[Name, TeamClassLimit] = Field(default_factory=dict)
    windows: list[WindowSpec] = Field(default_factory=list)
    description: str = ""
    #: who may submit for the team, cancel its jobs and read their logs (note 025): Unix
    #: user names, or ``@group`` for a Unix group (resolved with grp at each check); unset:
    #: the tokens' teams decide, as before; ``[]``: admins only
    members: Annotated[list[Member], Field(max_length=MAX_MEMBERS)] | None = None



class CohortMemberSpec(_Strict):
    """A team's quota in one cohort (overrides the team's own fields)."""

    team: Name
    nominal_gpus: NonNegInt | None = None
    borrowing_limit: NonNegInt | None = None
    lending_limit: NonNegInt | None = None


class CohortSpec(_Strict):
    """Teams that lend each other idle nominal quota (Kueue's cohort): the cohort holds
    the sum of its members' ``nominal_gpus``; a member may borrow what others do not
    use (within its ``borrowing_limit`` and their ``lending_limit``), and a member that
    needs its nominal quota back preempts borrowers (``reclaim``)."""

    #: team names (their nominal_gpus, borrowing_limit and lending_limit apply), or
    #: entries that give the team's quota in this cohort (per pool)
    members: Annotated[list[CohortMemberSpec], Field(min_length=1, max_length=1000)]
    #: the pool the cohort's quota is for: it counts the jobs whose class may run only
    #: in this pool (classes.X.pools); unset: every job of its members, anywhere
    pool: Name | None = None
    #: any: borrowers of any class are preempted to give nominal quota back (Kueue's
    #: reclaimWithinCohort: Any); lower_priority: only of lower classes; never
    reclaim: Literal["any", "lower_priority", "never"] = "any"
    description: str = ""

    @field_validator("members", mode="before")
    @classmethod
    def _names_are_members(cls, value: Any) -> Any:
        # a plain team name is a member with the team's own quota fields
        if isinstance(value, list):
            return [{"team": v} if isinstance(v, str) else v for v in value]
        return value


class PredictionSpec(_Strict):
    """Runtime predictions from the user's (else the team's) completed jobs: a job
    without an estimate of its own is predicted ``time limit x`` the ``quantile`` of
    the ratios run time / time limit of the last ``history`` completed jobs (Tsafrir
    et al., TPDS 2007). Used for reservations, backfill and the time_limit factor."""

    enabled: bool = False
    quantile: Annotated[float, Field(gt=0, le=1)] = 0.9
    history: Annotated[int, Field(ge=1, le=1000)] = 20
    min_jobs: Annotated[int, Field(ge=1, le=1000)] = 3

    @model_validator(mode="after")
    def _min_jobs_within_history(self) -> "PredictionSpec":
        if self.min_jobs > self.history:
            raise ValueError(f"min_jobs ({self.min_jobs}) is more than history ({self.history}): "
                             "predictions could never be made; allowed: min_jobs <= history")
        return self


class PreemptionSpec(_Strict):
    enabled: bool = True
    #: a running job younger than this is not preempted (no thrash)
    min_runtime_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0


class MigSpec(_Strict):
    """MIG reconfiguration (issue #4): when pending jobs want profiles no free instance
    offers, the core may re-partition an idle MIG GPU (``ReconfigureMig``); the GPU is
    out of service for ``delay_s`` while the driver applies it."""

    reconfigure: bool = False
    delay_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 60.0


class BackfillSpec(_Strict):
    """EASY-style backfill (Lifka 1995; Slurm's sched/backfill): the top blocked jobs
    get reservations; a later job may start now only if it cannot delay them."""

    enabled: bool = True
    #: how many blocked jobs get a reservation each pass (Slurm: bf_max_job_test ~ depth)
    reservations: PosInt = 1
    #: how many pending jobs one pass examines at most for backfill
    max_job_test: PosInt = 1000


class WeightsSpec(_Strict):
    """Weights of the priority factors (each factor is in [0, 1])."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)

    class_: Weight = Field(default=1_000_000.0, alias="class")
    fair_share: Weight = 0.0
    age: Weight = 0.0
    size: Weight = 0.0
    #: shorter time limits rank higher (factor 1 - limit / max_time_limit_s)
    time_limit: Weight = 0.0


class PrioritySpec(_Strict):
    """Multifactor priority (Slurm's priority/multifactor): jobs are ordered by the
    weighted sum of their factors, then submit time, then job id."""

    weights: WeightsSpec = Field(default_factory=WeightsSpec)
    #: the wait at which the age factor reaches 1 (Slurm's PriorityMaxAge)
    max_age_s: PosFloat = 7 * 86400.0
    #: the time limit at which the time_limit factor reaches 0 (longer limits: 0 too)
    max_time_limit_s: PosFloat = 7 * 86400.0
    #: how often scores are recomputed, seconds (Slurm's PriorityCalcPeriod)
    recalc_s: PosFloat = 300.0


class FairShareSpec(_Strict):
    """Decayed usage: GPU-seconds held, halving every ``half_life_s`` seconds."""

    half_life_s: Annotated[float, Field(allow_inf_nan=False)] = 7 * 86400.0
    #: rank teams (``team``) or also users within their team (``user``)
    level: Literal["team", "user"] = "team"

    @field_validator("half_life_s")
    @classmethod
    def _positive(cls, v: float) -> float:
        if not v > 0:
            raise ValueError("seconds > 0 (a half-life of 0 would forget all usage at once and turn fair-share "
                             "into FIFO; to turn fair-share off set priority.weights.fair_share to 0)")
        return v


class PricingSpec(_Strict):
    """Showback/chargeback prices (R15, note 010): ``gpu_hour`` maps a GPU type of the
    cluster (``cluster.nodes[].gpu_type``) or ``default`` to a price per GPU-hour in
    ``currency``. A MIG instance or a share is priced pro rata (its GPU units / 7000)."""

    currency: Annotated[str, Field(min_length=1, max_length=16)] = "EUR"
    gpu_hour: Annotated[dict[Annotated[str, Field(min_length=1, max_length=128)],
                             Annotated[float, Field(ge=0, allow_inf_nan=False)]], Field(min_length=1)]


class PolicySpec(_Strict):
    version: Literal[1] = 1
    name: str = ""
    cluster: ClusterSpec
    classes: dict[Name, ClassSpec] = Field(default_factory=dict)
    teams: dict[Name, TeamSpec] = Field(default_factory=dict)
    cohorts: dict[Name, CohortSpec] = Field(default_factory=dict)
    prediction: PredictionSpec = Field(default_factory=PredictionSpec)
    preemption: PreemptionSpec = Field(default_factory=PreemptionSpec)
    backfill: BackfillSpec = Field(default_factory=BackfillSpec)
    mig: MigSpec = Field(default_factory=MigSpec)
    #: team for jobs that name none
    default_team: Name | None = None
    clock: ClockSpec = Field(default_factory=ClockSpec)
    priority: PrioritySpec = Field(default_factory=PrioritySpec)
    fair_share: FairShareSpec = Field(default_factory=FairShareSpec)
    #: prices per GPU-hour for the report (optional; the core never reads them)
    pricing: PricingSpec | None = None

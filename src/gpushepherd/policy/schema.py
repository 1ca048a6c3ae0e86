"""The policy file's schema (YAML, validated with pydantic v2).

A policy states the cluster (pools, nodes or node groups), the workload classes
(priority, preemptible, checkpointable, max runtime, where they may run, class-wide
limits) and the teams (nominal and max GPUs, per-class and per-user limits, a parent
team). Every model forbids unknown fields, so a typo is an error, never ignored.

The five standard workload classes of requirement R1 exist in every policy with the
defaults below; a policy's ``classes`` entry for one of them overrides only the fields
it names. Numeric priorities follow the public scenario conventions: 400 / 300 / 250 /
200 / 100.

Every field has a ``description`` (what it means, its unit, the rule of Slurm, Kueue,
Kubernetes or KAI it follows) and an example; ``docs/policy.md`` is generated from them
(``shepherd policy reference``, ``gpushepherd.policy.reference``; a test keeps it current).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, ValidationInfo, WithJsonSchema,
                      field_validator, model_validator)

NonNegInt = Annotated[int, Field(ge=0)]
PosInt = Annotated[int, Field(ge=1)]
PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
#: a weight: finite, >= 0
Weight = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")]
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
_QUOTA_ALLOWED = "a number of GPUs >= 0, or a mapping GPU type -> GPUs >= 0 (1-64 types), e.g. {H100-80GB: 4}"


def _gpu_quota(value: Any) -> int | dict[str, int]:
    """A GPU quota field's value: a number (every type) or per GPU type (note 038).

    Raises:
        ValueError: naming the offending entry and what is allowed."""
    def count(v: Any, where: str = "") -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{where}{v!r} is not a whole number of GPUs; allowed: {_QUOTA_ALLOWED}")
        if v < 0:
            raise ValueError(f"{where}input should be greater than or equal to 0")
        return v

    if isinstance(value, dict):
        if not 1 <= len(value) <= 64:
            raise ValueError(f"{len(value)} GPU types; allowed: {_QUOTA_ALLOWED}")
        for k in value:
            if not isinstance(k, str) or not _NAME.fullmatch(k):
                raise ValueError(f"GPU type {k!r} is not a name (letters, digits, _ . -); allowed: {_QUOTA_ALLOWED}")
        return {k: count(v, f"for {k}: ") for k, v in value.items()}
    return count(value)


#: GPUs of every type (a number), or per GPU type (``{H100-80GB: 4, A100-80GB: 8}``; Kueue's quota per
#: ResourceFlavor): a type not named is not limited by the field (note 038)
GpuQuota = Annotated[int | dict[str, int], PlainValidator(_gpu_quota), WithJsonSchema({"anyOf": [
    {"type": "integer", "minimum": 0},
    {"type": "object", "patternProperties": {"^[A-Za-z0-9][A-Za-z0-9_.\\-]*$": {"type": "integer", "minimum": 0}},
     "minProperties": 1, "maxProperties": 64}]})]

#: units the reference names
SECONDS, GPUS, MIB, PERCENT, JOBS, GPU_HOUR = "seconds", "GPUs", "MiB", "percent", "jobs", "currency per GPU-hour"


def doc(description: str, example: Any, unit: str = "") -> dict[str, Any]:
    """``Field`` keywords that document a field for the policy reference
    (``docs/policy.md``): what it means, one example value (validated by the tests) and
    its unit (``SECONDS``, ``GPUS``, ``MIB``, ...; '' for none)."""
    out: dict[str, Any] = {"description": description, "examples": [example]}
    if unit:
        out["json_schema_extra"] = {"unit": unit}
    return out


class _Strict(BaseModel):
    # strict: YAML's `true` is no 1 and "8" is no 8 (ints still pass as floats)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class TimeSlicingSpec(_Strict):
    """Time-slicing (R10; the NVIDIA device plugin's ``sharing.timeSlicing``): each GPU
    is offered as ``replicas`` virtual GPUs, with no memory isolation."""

    replicas: Annotated[int, Field(ge=1, le=64)] = Field(**doc(
        "Replicas each GPU is offered as (the device plugin's `replicas`); a time-sliced job takes `ts_replicas` "
        "of them and must declare the GPU memory it uses, which is accounted so that neighbours cannot run out "
        "of memory.", 4, "replicas"))


class MpsSpec(_Strict):
    """CUDA MPS (R10; the NVIDIA device plugin's ``sharing.mps``): several processes
    share a GPU's SMs, each client limited to an SM percentage."""

    max_clients: Annotated[int, Field(ge=1, le=48)] = Field(**doc(
        "MPS clients (replicas) per GPU (at most 48, CUDA's limit): a job takes `mps_replicas` of them; the "
        "clients on one GPU get at most 100 % of its SMs in all (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`), and a "
        "job that gives no SM percentage gets 100 / `max_clients` per replica, and is charged that in quotas "
        "where it lands (note 037).", 8, "clients"))
    max_memory_per_client_mib: Annotated[int, Field(ge=1)] | None = Field(None, **doc(
        "GPU memory one MPS client (replica) may pin, MiB: set for the job's processes as "
        "`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`; a job declaring more per replica does not run here, one declaring "
        "none is counted this much per replica. At most the GPU memory (`gpu_mem_mib`). Unset: no cap.", 10240,
        "MiB"))


class SharingSpec(_Strict):
    """What the node's non-MIG GPUs allow besides whole-GPU jobs (R10): ``fractions``
    (a compute fraction and/or declared GPU memory, Ray/KAI style; on by default),
    ``time_slicing`` replicas per GPU (NVIDIA device plugin), MPS clients per GPU."""

    fractions: bool = Field(True, **doc(
        "Whether a GPU may hold several jobs that each ask for a compute fraction and/or GPU memory (Ray's "
        "`num_gpus: 0.5`, KAI's `gpu-fraction` / `gpu-memory`); the declared memory on a card never exceeds its "
        "memory.", True))
    time_slicing: TimeSlicingSpec | None = Field(None, **doc(
        "Time-sliced replicas per GPU; unset: no time-slicing on this node.", {"replicas": 4}))
    mps: MpsSpec | None = Field(None, **doc("MPS clients per GPU; unset: no MPS on this node.", {"max_clients": 8}))


class MigGpuSpec(_Strict):
    """One GPU's MIG mode: ``layout`` lists profile names (``1g.10gb``) of NVIDIA's MIG
    user guide for the node's GPU type; they are placed at valid starts."""

    enabled: bool = Field(True, **doc("Whether the GPU is in MIG mode (`nvidia-smi -mig 1`); a GPU in MIG mode is "
                                      "never handed out whole.", True))
    layout: list[Annotated[str, Field(min_length=1, max_length=32)]] = Field(default_factory=list, **doc(
        "Its MIG instances by profile name, as NVIDIA's MIG user guide names them for the GPU type (lower case); "
        "placed at valid starts in the order given. Required when enabled.", ["3g.40gb", "2g.20gb", "1g.10gb",
                                                                               "1g.10gb"]))

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

    name: Name = Field(**doc("The node's name (with `count` > 1, the group's: nodes `<name>-001`, ...); unique. "
                             "With a backend, the engine's node name (Slurm, Kubernetes, Ray).", "gpu-server-1"))
    count: Annotated[int, Field(ge=1, le=100_000)] = Field(1, **doc("Identical nodes in the group.", 16, "nodes"))
    gpus: Annotated[int, Field(ge=1, le=256)] = Field(**doc("GPUs per node.", 8, GPUS))
    gpu_type: Name = Field("generic", **doc(
        "The GPU model, as jobs ask for it (`gpu_types`) and prices name it (`pricing.gpu_hour`); Kubernetes' "
        "`nvidia.com/gpu.product`, a Slurm GRES type.", "H100-80GB"))
    gpu_mem_mib: Annotated[int, Field(ge=0, le=2**31)] = Field(0, **doc(
        "Memory of each GPU; jobs asking for more per GPU do not run here, shares' declared memory adds up to at "
        "most this. 0: unknown (memory is not checked).", 81920, MIB))
    pool: Name = Field("default", **doc(
        "The node pool (Kubernetes node pool, Slurm partition, Kueue ResourceFlavor); classes may be confined to "
        "pools (`classes.<name>.pools`), cohorts count per pool. Must be one of `cluster.pools` when that is given.",
        "inference"))
    labels: dict[Name, Annotated[str, Field(strict=False, coerce_numbers_to_str=True)]] = Field(
        default_factory=dict, **doc("Node labels jobs may select (`node_selector`, Kubernetes' nodeSelector; a "
                                    "Slurm feature is a label with value '').", {"zone": "a", "nvlink": ""}))
    nvlink_islands: list[list[NonNegInt]] = Field(default_factory=list, **doc(
        "Groups of GPU indices joined by NVLink; a multi-GPU job is placed inside one island when it can (a "
        "preference, R11: in the node, the GPUs and the victims chosen), and only inside one for a job or class "
        "with `require_island`. Empty: unknown topology, the node counts as one island of all its GPUs.",
        [[0, 1, 2, 3], [4, 5, 6, 7]]))
    gpu_uuids: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(default_factory=list, **doc(
        "The GPUs' UUIDs in index order (`nvidia-smi -L`), one per GPU, for a single node: the daemon checks them "
        "against NVML and sets `CUDA_VISIBLE_DEVICES` by UUID.", ["GPU-5f2a1c0e-0000-4000-8000-000000000000"]))
    driver: Annotated[str, Field(max_length=32, pattern=r"^(\d+(\.\d+)*)?$")] = Field("", **doc(
        "The NVIDIA driver version; jobs with a higher `min_driver` do not run here ('': unknown).", "535.104.05"))
    cuda: Annotated[str, Field(max_length=32, pattern=r"^(\d+(\.\d+)*)?$")] = Field("", **doc(
        "The CUDA version the driver supports ('': unknown); shown, not yet matched.", "12.2"))
    taints: list[Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][^\s]*$")]] = Field(
        default_factory=list, **doc(
            "Kubernetes-style taints, `key=value[:Effect]` or `key`: only jobs that tolerate every one "
            "(`tolerations`: the taint, `key=value` or `key`) run here (NoSchedule) - e.g. keep experiments off "
            "an inference node (R1, R11).", ["dedicated=inference:NoSchedule"]))
    cached: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(default_factory=list, **doc(
        "Models or datasets already on the node's disk; a job with that `cache_key` prefers the node (requires it "
        "with `cache_required`), R11's locality.", ["llama-70b"]))
    sharing: SharingSpec = Field(default_factory=SharingSpec, **doc(
        "How its non-MIG GPUs may be shared besides whole-GPU jobs: a mapping, or the shorthand `fractions` / "
        "`memory_slices` (fractions on, the default) or `exclusive` (whole GPUs only).",
        {"fractions": True, "time_slicing": {"replicas": 4}, "mps": {"max_clients": 8}}))
    mig: dict[Annotated[str, Field(pattern=r"^g?[0-9]+$")], MigGpuSpec] = Field(default_factory=dict, **doc(
        "Which GPUs are in MIG mode and their instances: GPU index (`0`, `\"0\"` or `g0`) -> MIG layout; the "
        "other GPUs are not in MIG mode.", {"g0": {"layout": ["3g.40gb", "3g.40gb"]}}))

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

    @model_validator(mode="after")
    def _mps_memory_within_gpu(self) -> "NodeGroupSpec":
        mps = self.sharing.mps if self.sharing is not None else None
        cap = mps.max_memory_per_client_mib if mps is not None else None
        if cap is not None and self.gpu_mem_mib and cap > self.gpu_mem_mib:
            raise ValueError(f"sharing.mps.max_memory_per_client_mib: {cap} is not allowed: at most the GPU memory "
                             f"(gpu_mem_mib {self.gpu_mem_mib})")
        return self


#: ``00:00``..``23:59`` or ``24:00``; a policy that comes in may give ``24:00`` as a window's
#: ``to`` only (midnight at the end of the day; as a start it would be the next day's
#: ``00:00``: checked at intake, ``policy.load``, so that a logged policy replays as accepted)
HHMM = Annotated[str, Field(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$|^24:00$")]
Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
WINDOW_FIELDS = ("max_gpus", "max_gpus_per_user", "max_running_jobs", "max_running_jobs_per_user")


class WindowSpec(_Strict):
    """A time window in which other limits hold: ``[from, to)`` local time on ``days``
    (``from`` > ``to`` wraps past midnight and belongs to the day it starts)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)

    name: str = Field("", **doc("A label shown in reasons (`WindowLimit(night)`) and `policy check`; '': its "
                                "times.", "night"))
    days: list[Weekday] | None = Field(None, **doc(
        "The days it starts on, at least one; unset (omit the field): every day. An empty list `[]` is refused.",
        ["sat", "sun"]))
    from_: HHMM = Field(default="00:00", alias="from", **doc(
        "Local start time `HH:MM`, `00:00` to `23:59` (`clock.timezone`; `24:00` is refused: write `00:00` on the "
        "next day); a window with `from` later than `to` runs past midnight. "
        "Quote it: YAML reads an unquoted `20:00` as the number 1200.", "20:00"))
    to: HHMM = Field("24:00", **doc("Local end time `HH:MM`, exclusive (`24:00`: midnight); quoted, as `from`.",
                                    "08:00"))
    max_gpus: NonNegInt | None = Field(None, **doc(
        "`max_gpus` while the window is open (GPUs held at once). For a team it may be below `nominal_gpus` (the "
        "one way to shrink a team's share for some hours; `policy check` notes it): the rest of the guarantee is "
        "lent or idle meanwhile.", 6, GPUS))
    max_gpus_per_user: NonNegInt | None = Field(None, **doc("`max_gpus_per_user` while the window is open.", 2,
                                                            GPUS))
    max_running_jobs: NonNegInt | None = Field(None, **doc(
        "`max_running_jobs` while the window is open (teams only).", 10, JOBS))
    max_running_jobs_per_user: NonNegInt | None = Field(None, **doc(
        "`max_running_jobs_per_user` while the window is open.", 2, JOBS))

    @model_validator(mode="after")
    def _sets_a_limit(self) -> "WindowSpec":
        if all(getattr(self, f) is None for f in WINDOW_FIELDS):
            raise ValueError("a window must set at least one of " + ", ".join(WINDOW_FIELDS))
        return self


class ClockSpec(_Strict):
    """How the scheduler's seconds map to local time: ``start`` is the local wall time
    of ``t = 0`` (trace replays; ISO 8601); without it ``t`` is Unix time."""

    timezone: str = Field("UTC", **doc("The IANA time zone windows are read in (daylight saving included).",
                                       "Europe/Berlin"))
    start: str | None = Field(None, **doc(
        "ISO 8601 local time of `t = 0` (trace replays, scenarios); unset: `t` is Unix time (the daemon).",
        "2026-11-30T00:00:00"))


class PoolSpec(_Strict):
    """A node pool (Kubernetes node pool, Slurm partition): a name nodes and classes use."""

    name: Name = Field(**doc("The pool's name.", "inference"))
    description: str = Field("", **doc("Free text.", "H100 nodes for production inference"))


class ClusterSpec(_Strict):
    """The GPUs: nodes (or groups of identical nodes) and, optionally, the pools they
    belong to. With a backend, the policy's nodes must be the engine's."""

    pools: list[PoolSpec] = Field(default_factory=list, **doc(
        "The pools, declared; when given, every node's `pool` must be one of them. Unset: the pools the nodes name.",
        [{"name": "inference"}, {"name": "training"}]))
    nodes: list[NodeGroupSpec] = Field(min_length=1, **doc(
        "The nodes; at least one.", [{"name": "gpu-server-1", "gpus": 8, "gpu_type": "H100-80GB",
                                      "gpu_mem_mib": 81920}]))


class IdleStopSpec(_Strict):
    """Idle auto-stop (R16, note 009): a job whose GPU utilisation samples stay below
    ``below_util_pct`` percent for ``after_s`` seconds is stopped (with the class's
    grace period when it checkpoints); the first ``setup_s`` seconds of each run count
    as activity. A job without samples (no NVML) is never idle."""

    below_util_pct: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] = Field(5.0, **doc(
        "GPU utilisation below which a sample counts as idle.", 5.0, PERCENT))
    after_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = Field(1800.0, **doc(
        "How long a job must stay idle before it is stopped.", 1800.0, SECONDS))
    setup_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(300.0, **doc(
        "The first seconds of each run count as activity (loading a model).", 300.0, SECONDS))


class ClassSpec(_Strict):
    """A workload class (R1). Unset (``null``) fields take the standard class's default.

    ``max_gpus`` caps the GPUs the whole class holds at once (cluster-wide);
    ``max_gpus_per_user`` caps one user's GPUs in the class; ``reserved_gpus`` are
    guaranteed to the class and never lent to other classes (R4's "reserve 2 GPUs for
    production inference"): other classes may use at most the capacity minus the
    unused part of every reservation, kept as free whole GPUs (a shared card only the
    class's jobs hold counts whole for it: a share of another class joins it only while
    free GPUs cover the unused part). A reservation keeps at most the GPUs of the nodes
    the class's pools allow (note 069).
    """

    priority: NonNegInt | None = Field(None, **doc(
        "Class priority: higher classes are ordered first and may preempt lower ones (Kueue "
        "WorkloadPriorityClass, Slurm QOS priority). Required for a class that is not a standard one.", 350))
    preemptible: bool | None = Field(None, **doc(
        "Whether its jobs may be preempted by higher classes and reclaimed by cohort lenders (R6); production "
        "inference never is.", True))
    checkpointable: bool | None = Field(None, **doc(
        "Whether its jobs checkpoint by default (a job may say otherwise): a preempted one resumes with the work "
        "done before the signal, one that does not restarts from zero; only checkpointing jobs get the grace "
        "period.", True))
    preempt_only_if_checkpointable: bool | None = Field(None, **doc(
        "Preempt only the jobs of this class that checkpoint (R6, R13: training without checkpoints is never "
        "preempted).", True))
    max_runtime_s: PosFloat | None = Field(None, **doc(
        "The longest time limit a job may ask for; a job runs at most this long (Slurm's partition `MaxTime`). A "
        "job asking for more is refused at submit.", 28800.0, SECONDS))
    default_time_limit_s: PosFloat | None = Field(None, **doc(
        "The time limit of a job that gives none (Slurm's `DefaultTime`); at most `max_runtime_s`.", 86400.0,
        SECONDS))
    grace_period_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = Field(None, **doc(
        "Seconds a signalled checkpointing job keeps its GPUs to checkpoint and exit before SIGKILL (Kubernetes' "
        "`terminationGracePeriodSeconds`, Slurm's `GraceTime`); 0 when unset. Jobs that do not checkpoint get 0.",
        120.0, SECONDS))
    pools: list[Name] | None = Field(None, **doc(
        "The node pools its jobs may run in (R1: production inference never shares a pool with sandbox work); "
        "unset: any.", ["inference"]))
    max_gpus: NonNegInt | None = Field(None, **doc(
        "The most GPUs the whole class holds at once, cluster-wide (R4: training at most 4; Slurm QOS "
        "`GrpTRES=gres/gpu`).", 4, GPUS))
    max_gpus_per_user: NonNegInt | None = Field(None, **doc(
        "The most GPUs one user holds in the class (R16: sandbox 1 per user; Slurm QOS `MaxTRESPerUser`).", 1, GPUS))
    max_running_jobs_per_user: NonNegInt | None = Field(None, **doc(
        "The most running jobs of one user in the class (Slurm QOS `MaxJobsPerUser`).", 2, JOBS))
    reserved_gpus: NonNegInt | None = Field(None, **doc(
        "GPUs guaranteed to the class and never lent to other classes (R4: reserve 2 for production inference); "
        "other classes may use at most the capacity minus the unused part of every reservation, kept as free "
        "whole GPUs (a shared card only the class's jobs hold counts whole for it: a share of another class "
        "joins it only while free GPUs cover the unused part). It keeps at most the GPUs of the nodes in the "
        "class's `pools` (a Slurm reservation's nodes lie in its partition).", 2, GPUS))
    windows: list[WindowSpec] = Field(default_factory=list, **doc(
        "Limits that change with the time of day and week (R4: batch 2 GPUs by day, 6 by night; R8); outside "
        "every window the class's own limits hold.", [{"name": "night", "from": "20:00", "to": "08:00",
                                                        "max_gpus": 6}]))
    on_window_close: Literal["drain", "checkpoint-and-stop"] | None = Field(None, **doc(
        "What happens to running jobs over a limit when a window closes: `drain` (they run to their end; the "
        "default) or `checkpoint-and-stop` (preempted with their grace period and requeued, R8).",
        "checkpoint-and-stop"))
    sharing: list[Literal["whole", "fraction", "time_slice", "mps", "mig"]] | None = Field(default=None, min_length=1,
                                                                                           **doc(
        "The kinds of GPU its jobs may take (R10): whole GPUs, fractions / memory slices, time-slice replicas, MPS "
        "clients, MIG instances; a job asking for another kind is refused at submit. Unset: any (production "
        "inference: whole and MIG).", ["whole", "mig"]))
    avoid_nodes_with: list[Name] = Field(default_factory=list, **doc(
        "Anti-affinity (R11): its jobs do not start on a node where a job of one of these classes holds GPUs, nor "
        "theirs on one where this class does.", ["production-inference"]))
    idle_stop: IdleStopSpec | None = Field(None, **doc(
        "Idle auto-stop (R16): a job idle by its GPU utilisation samples is stopped; the standard sandbox class "
        "has it on (5 %, 1800 s, 300 s of setup); `null` turns it off. Only for preemptible classes.",
        {"below_util_pct": 5, "after_s": 1800, "setup_s": 300}))
    memory_overrun: Literal["warn", "stop"] | None = Field(None, **doc(
        "A job whose peak GPU memory exceeds what it declared: `warn` (flag it; the default) or `stop` it - on a "
        "shared card (fraction, time-slicing, MPS) only; a whole GPU or MIG instance is only flagged. `stop` only "
        "for preemptible classes.", "stop"))
    queueing: Literal["best_effort_fifo", "strict_fifo"] | None = Field(None, **doc(
        "How the class's queue is ordered (Kueue `queueingStrategy`): `best_effort_fifo` (the default: a job "
        "that cannot start yet lets later ones that can start or backfill) or `strict_fifo` (`StrictFIFO`: no "
        "job of the class starts before an earlier pending one of the class that may use the same nodes - a head "
        "waiting for H100s does not hold back jobs for A100s; a head that can never start holds back nobody). "
        "Waiting jobs read `Priority(<head>)` (note 031).", "strict_fifo"))
    stop_signal: Literal["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"] | None = Field(None, **doc(
        "The signal its jobs get when preempted or stopped (time limit, window, idle), before SIGKILL at the end "
        "of the grace period (Slurm's `--signal`, Docker's `STOPSIGNAL`); SIGTERM when unset.", "SIGUSR1"))
    require_island: bool | None = Field(None, **doc(
        "Whether a multi-GPU job of the class must get all its GPUs inside one NVLink island of one node "
        "(`cluster.nodes[].nvlink_islands`): it waits as `NoFit(nvlink-island)` rather than span islands, and one "
        "no node's island can ever hold is refused as `ExceedsCapacity`. A node that declares no islands counts as "
        "one island of all its GPUs. A job may say otherwise (`require_island`); gangs of pods ignore the class's "
        "setting. Unset: false - islands are a preference (node, GPUs and victims are chosen to keep a job on one "
        "island when they can).", True))
    description: str | None = Field(None, **doc("Free text (`policy check` shows it).", "exploratory runs"))


#: a user's name wherever one is given (``teams.X.members``, a job's ``user``, a token's):
#: POSIX portable names, as useradd takes them
USER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,62}\$?")
USER_NAME_RULE = "letters, digits, _ . - (a trailing $ too), 1-64 characters, not starting with - or ."


def user_name_refusal(v: str) -> str | None:
    """Why ``v`` is no user's name (``USER_NAME``: the grammar of ``teams.X.members``), or
    ``None``. Shown as ``repr`` (spaces, zero-width characters and escapes visible)."""
    if USER_NAME.fullmatch(v):
        return None
    return f"{v[:80]!r} is not allowed: a Unix user's name ({USER_NAME_RULE}), e.g. ana"


#: a ``teams.X.members`` entry: a user name or ``@group``
_MEMBER = re.compile("@?" + USER_NAME.pattern)
MAX_MEMBERS = 10_000


def _member(v: str) -> str:
    if not _MEMBER.fullmatch(v):
        raise ValueError("a Unix user name (alice) or @ and a Unix group (@ml-users): letters, digits, _ . - (a "
                         "trailing $ too), 1-64 characters, not starting with - or .")
    return v


Member = Annotated[str, AfterValidator(_member)]


class TeamClassLimit(_Strict):
    """A team's limits for one workload class (Slurm: an association's QOS limits)."""

    max_gpus: NonNegInt | None = Field(None, **doc("The most GPUs the team's jobs of the class hold at once.", 2,
                                                   GPUS))
    max_running_jobs: NonNegInt | None = Field(None, **doc("The most running jobs of the team in the class.", 4,
                                                           JOBS))
    queueing: Literal["best_effort_fifo", "strict_fifo"] | None = Field(None, **doc(
        "The order of the team's own queue of the class (Kueue: a ClusterQueue's `queueingStrategy`): "
        "`strict_fifo` holds the team's later jobs of the class behind its earliest pending one that may use the "
        "same nodes (other teams' jobs are not held back); unset: the class's `queueing`.", "strict_fifo"))


class TeamPreemptionSpec(_Strict):
    """Preemption inside a team's own quota (Kueue's ``withinClusterQueue``, Slurm's QOS
    preemption inside an account; note 035)."""

    within_team: Literal["never", "lower_priority"] = Field("never", **doc(
        "A job that only a limit of this team keeps waiting (`max_gpus`, `max_running_jobs`, per user, per class) "
        "may preempt the team's running jobs of a lower class that count in that limit (`lower_priority`), or not "
        "(`never`, the default). For a parent team: its limit, its and its child teams' jobs. Victims are "
        "preemptible jobs past `preemption.min_runtime_s`, chosen as any preemption's; they get their grace "
        "period.", "lower_priority"))


class TeamSpec(_Strict):
    """A team (Slurm account, Kueue ClusterQueue).

    ``nominal_gpus`` is the team's guaranteed share (the sum over teams may not exceed
    the cluster); ``max_gpus`` the most it may hold at once; ``parent`` makes the team
    count against its parent's limits too (hierarchical queues). The four GPU quota
    fields take a number (GPUs of every type) or a mapping GPU type -> GPUs (Kueue's
    quota per ResourceFlavor, note 038): a job is charged against the type it is placed
    on, and a job that may run on several types tries each.
    """

    nominal_gpus: GpuQuota | None = Field(None, **doc(
        "The team's guaranteed GPUs (Kueue ClusterQueue `nominalQuota`); top-level teams' nominal GPUs plus the "
        "classes' `reserved_gpus` add up to at most the cluster, a child's to at most its parent's. In a cohort "
        "it is what the team lends and may reclaim. Per GPU type: `{H100-80GB: 2, A100-80GB: 4}` (a type not "
        "named: 0 guaranteed; each type's sum at most the cluster's GPUs of that type).", 4, GPUS))
    max_gpus: GpuQuota | None = Field(None, **doc(
        "The most GPUs the team holds at once (Slurm association `GrpTRES=gres/gpu`; Kueue nominalQuota + "
        "borrowingLimit); at least `nominal_gpus`. Per GPU type: `{H100-80GB: 4, A100-80GB: 8}` caps the GPUs "
        "of each type named (the issue's `teams.X.gpus`); a type not named is not capped; reasons read "
        "`QuotaExceeded(teams.ml.max_gpus[H100-80GB]=4, in use 4)`.", 6, GPUS))
    borrowing_limit: GpuQuota | None = Field(None, **doc(
        "In a cohort: how many GPUs beyond `nominal_gpus` the team may borrow (Kueue `borrowingLimit`); unset: "
        "any. Only for a team in a cohort. Per GPU type in a cohort of per-type quotas (a type not named: any).",
        2, GPUS))
    lending_limit: GpuQuota | None = Field(None, **doc(
        "In a cohort: how much of `nominal_gpus` others may borrow (Kueue `lendingLimit`); the rest stays the "
        "team's even while idle. Unset: all of it. At most `nominal_gpus`; only for a team in a cohort. Per GPU "
        "type in a cohort of per-type quotas (a type not named: all of it).", 2, GPUS))
    shares: PosInt | None = Field(None, **doc(
        "The team's relative weight in fair-share (Slurm's `Fairshare=` shares): its factor is 2^(-usage share / "
        "shares share); 1 when unset. The trace mapping spreads mapped jobs over teams by it.", 2))
    max_gpus_per_user: NonNegInt | None = Field(None, **doc(
        "The most GPUs one user of the team holds at once (Slurm `MaxTRESPerUser`).", 2, GPUS))
    max_running_jobs: NonNegInt | None = Field(None, **doc(
        "The most running jobs of the team (R4's concurrent experiments; Slurm `GrpJobs`).", 10, JOBS))
    max_running_jobs_per_user: NonNegInt | None = Field(None, **doc(
        "The most running jobs of one user of the team (Slurm `MaxJobsPerUser`).", 2, JOBS))
    parent: Name | None = Field(None, **doc(
        "The parent team (Slurm's parent account, a hierarchical queue): the team's jobs count against its "
        "parent's limits too; no cycles.", "ml"))
    classes: dict[Name, TeamClassLimit] = Field(default_factory=dict, **doc(
        "Limits of the team per workload class.", {"training": {"max_gpus": 2}}))
    windows: list[WindowSpec] = Field(default_factory=list, **doc(
        "The team's limits that change with the time of day and week.", [{"days": ["sat", "sun"], "max_gpus": 8}]))
    description: str = Field("", **doc("Free text (the team's owner, ...).", "owned by the ML platform team"))
    preemption: TeamPreemptionSpec = Field(default_factory=TeamPreemptionSpec, **doc(
        "Preemption inside the team's own quota.", {"within_team": "lower_priority"}))
    members: Annotated[list[Member], Field(max_length=MAX_MEMBERS)] | None = Field(None, **doc(
        "Who may submit for the team, cancel its jobs and read their logs (note 025): Unix user names, or "
        "`@group` for a Unix group (resolved at each check). Unset: the tokens' teams decide; `[]`: admins only.",
        ["alice", "@ml-team"]))
    allowed_classes: Annotated[list[Name], Field(max_length=1000)] | None = Field(None, **doc(
        "The workload classes the team may submit (Kueue: the ClusterQueues a namespace's LocalQueues point to; "
        "Slurm: the account's `AllowQOS`/`QOS=` list); each a class of `classes`. A submission of another class is "
        "refused at submit (HTTP 422, naming this field); a child team may use only what every ancestor allows. "
        "Unset: every class. Jobs queued before a policy narrows it are not touched.", ["training", "batch"]))



class CohortMemberSpec(_Strict):
    """A team's quota in one cohort (overrides the team's own fields); each a number or
    per GPU type (note 038)."""

    team: Name = Field(**doc("A team of `teams`; in at most one cohort per pool (and one without a pool).", "ml"))
    nominal_gpus: GpuQuota | None = Field(None, **doc(
        "The team's nominal GPUs in this cohort (Kueue: the ClusterQueue's `nominalQuota` of the flavor); unset: "
        "the team's `nominal_gpus`. Per GPU type: `{H100-80GB: 2}`.", 4, GPUS))
    borrowing_limit: GpuQuota | None = Field(None, **doc(
        "What it may borrow in this cohort; unset: the team's `borrowing_limit`.", 2, GPUS))
    lending_limit: GpuQuota | None = Field(None, **doc(
        "What it lends in this cohort; unset: the team's `lending_limit`.", 1, GPUS))


class CohortSpec(_Strict):
    """Teams that lend each other idle nominal quota (Kueue's cohort): the cohort holds
    the sum of its members' ``nominal_gpus``; a member may borrow what others do not
    use (within its ``borrowing_limit`` and their ``lending_limit``), and a member that
    needs its nominal quota back preempts borrowers (``reclaim``)."""

    members: Annotated[list[CohortMemberSpec], Field(min_length=1, max_length=1000)] = Field(**doc(
        "Team names (their `nominal_gpus`, `borrowing_limit` and `lending_limit` apply), or entries giving the "
        "team's quota in this cohort; members are not each other's ancestors. The cohort's capacity is the sum of "
        "its members' nominal GPUs; with quotas per GPU type (any member's field a mapping: then all are, note "
        "038), each type's capacity is the cluster's GPUs of that type on the nodes the cohort counts (its pool) "
        "less other top-level teams' nominal GPUs of that type: GPUs no member is guaranteed are borrowable by "
        "every member within its `borrowing_limit`.", ["ml", {"team": "vision", "nominal_gpus": 2, "lending_limit": 1}]))
    pool: Name | None = Field(None, **doc(
        "The pool the cohort's quota is for (Kueue ResourceFlavor): it counts the jobs whose class may run only in "
        "this pool (`classes.<name>.pools`); unset: every job of its members, anywhere.", "training"))
    reclaim: Literal["any", "lower_priority", "never"] = Field("any", **doc(
        "Reclaim (Kueue `reclaimWithinCohort`): a member that needs its nominal quota back preempts borrowers of "
        "any class (`any`), only of lower classes (`lower_priority`), or never (`never`).", "lower_priority"))
    description: str = Field("", **doc("Free text.", "the research groups lend each other idle GPUs"))

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

    enabled: bool = Field(False, **doc("Whether runtimes are predicted.", True))
    quantile: Annotated[float, Field(gt=0, le=1)] = Field(0.9, **doc(
        "The quantile of the ratios run time / time limit used (0.9: a 90 % chance to end in time).", 0.9))
    history: Annotated[int, Field(ge=1, le=1000)] = Field(20, **doc("Completed jobs remembered per user and team.",
                                                                    20, JOBS))
    min_jobs: Annotated[int, Field(ge=1, le=1000)] = Field(3, **doc(
        "Completed jobs needed before predicting (at most `history`).", 3, JOBS))

    @model_validator(mode="after")
    def _min_jobs_within_history(self) -> "PredictionSpec":
        if self.min_jobs > self.history:
            raise ValueError(f"min_jobs ({self.min_jobs}) is more than history ({self.history}): "
                             "predictions could never be made; allowed: min_jobs <= history")
        return self


class PreemptionSpec(_Strict):
    """Preemption (R6): a pending job of a higher class evicts preemptible jobs of lower
    classes - the fewest victims, lowest class first, most recently started first - only
    when it then fits; victims get their class's grace period and are requeued. Cohort
    reclaim is preemption too."""

    enabled: bool = Field(True, **doc("Whether jobs are preempted at all (priority and cohort reclaim).", True))
    min_runtime_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(0.0, **doc(
        "A running job younger than this is not preempted (no thrash; Kueue's and KAI's minimum runtime).", 300.0,
        SECONDS))


class MigSpec(_Strict):
    """MIG reconfiguration (issue #4): when pending jobs want profiles no free instance
    offers, the core may re-partition an idle MIG GPU (``ReconfigureMig``); the GPU is
    out of service for ``delay_s`` while the driver applies it."""

    reconfigure: bool = Field(False, **doc("Whether idle MIG GPUs may be re-partitioned for pending jobs.", True))
    delay_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(60.0, **doc(
        "How long a GPU is out of service while the driver applies a new layout.", 60.0, SECONDS))


class BackfillSpec(_Strict):
    """EASY-style backfill (Lifka 1995; Slurm's sched/backfill): the top blocked jobs
    get reservations; a later job may start now only if it cannot delay them."""

    enabled: bool = Field(True, **doc("Whether later jobs may start before blocked ones (R7).", True))
    reservations: PosInt = Field(1, **doc(
        "How many blocked jobs get a reservation (an earliest start from the running jobs' estimates) each pass.",
        2, JOBS))
    max_job_test: PosInt = Field(1000, **doc(
        "How many pending jobs one pass examines at most for backfill (Slurm's `bf_max_job_test`).", 500, JOBS))


class WeightsSpec(_Strict):
    """Weights of the priority factors (each factor is in [0, 1])."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)

    class_: Weight = Field(default=1_000_000.0, alias="class", **doc(
        "Weight of the class factor (class priority / the highest class priority); the default makes class "
        "decide first (Slurm's `PriorityWeightQOS`).", 1000000.0))
    fair_share: Weight = Field(0.0, **doc(
        "Weight of the fair-share factor 2^(-usage/shares) (R5; Slurm's `PriorityWeightFairshare`).", 10000.0))
    age: Weight = Field(0.0, **doc("Weight of the age factor (wait / `max_age_s`, at most 1; Slurm's "
                                   "`PriorityWeightAge`).", 1000.0))
    size: Weight = Field(0.0, **doc("Weight of the size factor (GPUs / cluster GPUs; Slurm's "
                                    "`PriorityWeightJobSize`).", 100.0))
    time_limit: Weight = Field(0.0, **doc(
        "Weight of the short-limit factor 1 - limit / `max_time_limit_s`: shorter time limits rank higher.", 500.0))
    deadline: Weight = Field(0.0, **doc(
        "Weight of the deadline factor (note 034): a job at risk of missing its deadline - slack = deadline - now - "
        "its remaining estimate (or time limit) between 0 and `deadline_horizon_s` - gets 1 - slack / horizon, so "
        "the least slack ranks first (least-laxity-first); a job that can no longer make it, or has slack to "
        "spare, gets 0. A job with no estimate of its own whose user (or team) has `prediction.min_jobs` completed "
        "jobs gets the chance it can still end in time - the share of their last `prediction.history` ratios run "
        "time / time limit at most (deadline - now) / limit - while its slack by the median ratio is within the "
        "horizon (note 068; the ratios are kept whenever this weight is set, with or without `prediction.enabled`). "
        "Jobs of the top class (production inference) always get 1, so the factor never lifts a job "
        "above one of theirs.", 200000.0))


#: The order every bundled policy carries (``examples/policies/*.yaml``, the demo policies;
#: design note 045): the top class first as a hard tier, the others by shortest time limit
#: (or prediction) with age lifting any job that waits, recomputed hourly. Not the
#: schema's defaults (class order alone), which earlier policies and scenarios rely on.
DEFAULT_ORDER: dict = {"top_class_tier": True, "weights": {"class": 0, "time_limit": 1_000_000, "age": 100_000},
                       "max_age_s": 172_800, "recalc_s": 3_600}


class PrioritySpec(_Strict):
    """Multifactor priority (Slurm's priority/multifactor): jobs are ordered by the
    weighted sum of their factors, then submit time, then job id. Without this section
    the order is class alone; the bundled policies all carry ``DEFAULT_ORDER`` (design
    note 045): ``{top_class_tier: true, weights: {class: 0, time_limit: 1000000, age:
    100000}, max_age_s: 172800, recalc_s: 3600}``."""

    weights: WeightsSpec = Field(default_factory=WeightsSpec, **doc(
        "The factors' weights.", {"class": 1000000, "fair_share": 10000, "age": 1000}))
    max_age_s: PosFloat = Field(7 * 86400.0, **doc("The wait at which the age factor reaches 1 (Slurm's "
                                                   "`PriorityMaxAge`).", 86400.0, SECONDS))
    max_time_limit_s: PosFloat = Field(7 * 86400.0, **doc(
        "The time limit at which the time_limit factor reaches 0 (longer limits: 0 too).", 172800.0, SECONDS))
    recalc_s: PosFloat = Field(300.0, **doc("How often scores are recomputed (Slurm's `PriorityCalcPeriod`).",
                                            300.0, SECONDS))
    deadline_horizon_s: PosFloat = Field(86400.0, **doc(
        "The slack under which a job with a deadline counts as at risk (`weights.deadline`).", 21600.0, SECONDS))
    top_class_tier: bool = Field(False, **doc(
        "Order the jobs of the top class (the highest class priority: production inference unless a policy adds "
        "a higher class) before all other jobs, whatever their scores: a hard tier, as Slurm's partition "
        "`PriorityTier`, so that the other weights may order the remaining classes freely (note 045).", True))
    age_tier_s: PosFloat | None = Field(None, **doc(
        "A job that has waited this long (seen at the recalculations, every `recalc_s`) is ordered before every "
        "job that has not, below the top class's tier, the oldest first: later jobs no longer pass it, and when "
        "first it holds the backfill reservation (Slurm's age factor made a hard tier; note 053). Unset: no "
        "aged tier.", 172800.0, SECONDS))
    age_tier_jobs: PosInt | None = Field(None, **doc(
        "At most this many aged jobs are in the aged tier at once: at each recalculation the oldest aged jobs "
        "fill it up to this many, and one stays in it until it starts (a preempted one comes back into it). "
        "Unset: every aged job. 1: only the oldest waiting job is lifted - it alone holds the reservation it "
        "needs (Slurm's bf reservation for the longest waiting job; note 053).", 1, JOBS))

    @field_validator("age_tier_jobs")
    @classmethod
    def _tier_jobs_need_a_tier(cls, v: int | None, info: ValidationInfo) -> int | None:
        # only where age_tier_s is valid and unset (an invalid one has its own error)
        if v is not None and "age_tier_s" in info.data and info.data["age_tier_s"] is None:
            raise ValueError("only with priority.age_tier_s set (it caps the aged tier, which "
                             "age_tier_s turns on)")
        return v


class FairShareSpec(_Strict):
    """Decayed usage: GPU-seconds held, halving every ``half_life_s`` seconds."""

    half_life_s: Annotated[float, Field(allow_inf_nan=False)] = Field(7 * 86400.0, **doc(
        "Usage halves every this many seconds (Slurm's `PriorityDecayHalfLife`); > 0.", 604800.0, SECONDS))
    level: Literal["team", "user"] = Field("team", **doc(
        "Rank teams (`team`) or also users within their team (`user`).", "user"))

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

    currency: Annotated[str, Field(min_length=1, max_length=16)] = Field("EUR", **doc("The currency's name.",
                                                                                      "USD"))
    gpu_hour: Annotated[dict[Annotated[str, Field(min_length=1, max_length=128)],
                             Annotated[float, Field(ge=0, allow_inf_nan=False)]], Field(min_length=1)] = Field(**doc(
        "GPU type (or `default`) -> price of one GPU-hour; every GPU type of the cluster needs one (its own or "
        "`default`).", {"H100-80GB": 2.5, "default": 1.0}, GPU_HOUR))


class PolicySpec(_Strict):
    """The policy file: only ``cluster`` is required."""

    version: Literal[1] = Field(1, **doc("The format's version.", 1))
    name: str = Field("", **doc("A name shown by `policy check` and the server.", "small-team"))
    cluster: ClusterSpec = Field(**doc("The GPUs.", {"nodes": [{"name": "gpu-server-1", "gpus": 8}]}))
    classes: dict[Name, ClassSpec] = Field(default_factory=dict, **doc(
        "Workload classes by name: the five standard ones (see below) always exist and an entry changes only the "
        "fields it names; other names are new classes (with a `priority`).",
        {"batch": {"max_gpus": 2, "grace_period_s": 60}}))
    teams: dict[Name, TeamSpec] = Field(default_factory=dict, **doc(
        "Teams by name (Slurm accounts, Kueue ClusterQueues); with teams, every job names one of them.",
        {"research": {"nominal_gpus": 4, "max_gpus": 6}}))
    cohorts: dict[Name, CohortSpec] = Field(default_factory=dict, **doc(
        "Cohorts by name: teams that lend each other idle nominal quota (Kueue cohorts).",
        {"research": {"members": ["ml", "vision"], "reclaim": "any"}}))
    prediction: PredictionSpec = Field(default_factory=PredictionSpec, **doc(
        "Runtime predictions from completed jobs.", {"enabled": True}))
    preemption: PreemptionSpec = Field(default_factory=PreemptionSpec, **doc(
        "Preemption and reclaim.", {"enabled": True, "min_runtime_s": 300}))
    backfill: BackfillSpec = Field(default_factory=BackfillSpec, **doc("Backfill and reservations.",
                                                                       {"enabled": True, "reservations": 1}))
    mig: MigSpec = Field(default_factory=MigSpec, **doc("MIG reconfiguration.", {"reconfigure": True}))
    default_team: Name | None = Field(None, **doc("The team of jobs that name none; a team of `teams`.", "research"))
    clock: ClockSpec = Field(default_factory=ClockSpec, **doc("Local time for windows.",
                                                              {"timezone": "Europe/Berlin"}))
    priority: PrioritySpec = Field(default_factory=PrioritySpec, **doc("The order of pending jobs.",
                                                                       {"weights": {"fair_share": 10000}}))
    fair_share: FairShareSpec = Field(default_factory=FairShareSpec, **doc("Decayed usage for fair-share.",
                                                                           {"half_life_s": 604800}))
    pricing: PricingSpec | None = Field(None, **doc(
        "Prices per GPU-hour for the report (showback, R15); the core never reads them.",
        {"currency": "EUR", "gpu_hour": {"default": 1.0}}))

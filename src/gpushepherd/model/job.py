"""Job specifications and job states."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from functools import lru_cache


class JobState(str, enum.Enum):
    """Lifecycle of a job, with Slurm's state names where one exists.

    ``PENDING -> RUNNING -> COMPLETED | FAILED | CANCELLED | TIMEOUT``;
    ``RUNNING -> PREEMPTING`` (signalled, inside its grace period, still holding its
    GPUs) ``-> PENDING`` (requeued); ``RUNNING -> STOPPING`` (its time limit passed,
    signalled, inside its grace period) ``-> TIMEOUT``. A job on a lost node goes back
    to ``PENDING``. ``PENDING -> REJECTED`` at submit when no node of the inventory
    could ever hold the job (Slurm's "Requested node configuration is not available").
    """

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    PREEMPTING = "PREEMPTING"
    STOPPING = "STOPPING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    REJECTED = "REJECTED"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def holds_gpus(self) -> bool:
        return self is JobState.RUNNING or self is JobState.PREEMPTING or self is JobState.STOPPING


_TERMINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT,
                       JobState.REJECTED})


class ExitStatus(str, enum.Enum):
    """How a running job's process ended, as the driver (simulator, daemon) reports it.

    ``PREEMPTED`` is the exit of a job that was signalled by a ``Preempt`` decision
    (it checkpointed if it can) and must be requeued, whatever its exit code (note 048:
    a driver reports ``COMPLETED`` for such a job only when it exited on its own before
    the signal was sent); ``TIMEOUT`` the exit after a ``Stop`` for its time limit.
    """

    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    PREEMPTED = "PREEMPTED"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"


def first_control_char(text: str) -> str | None:
    """The first control character of ``text`` (C0, DEL or C1: terminal escapes), or
    ``None``. Names a person reads back (user, team, class, project) must have none."""
    return next((c for c in text if ord(c) < 32 or 127 <= ord(c) < 160), None)


_NUM = re.compile(r"(\d+)")


@lru_cache(maxsize=1 << 17)
def natural_key(text: str) -> tuple:
    """Sort key that orders ``B2`` before ``B10`` (digit runs compare as numbers).

    Used as the last tie-break between jobs, so that "job id ascending" means what
    a person reading the ids expects; distinct ids never tie. Memoised (a job's key is asked at every
    re-ordering of the queue).
    """
    parts = _NUM.split(text)
    key = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts if p != "")
    if any(len(p) > 1 and p[0] == "0" and p.isdigit() for p in parts):
        # ``j01`` and ``j1`` read alike: the text itself orders them, so that two ids
        # never tie (without a leading zero the parts give back the text: no tie)
        key += ((2, 0, text),)
    return key


#: the largest nice either way (Slurm's ``NICE_OFFSET - 3``)
MAX_NICE = 2_147_483_645

#: kinds of GPU sharing (a class may also allow ``whole``: whole GPUs)
SHARE_KINDS = ("fraction", "time_slice", "mps", "mig")
#: quota units per GPU: the least common multiple of milli-GPUs and MIG's seven
#: compute slices, so that every share is an exact integer number of units
GPU_UNITS = 7000


@dataclass(frozen=True, slots=True)
class GpuShare:
    """Part of one physical GPU (a job with a share has ``gpus == 1``).

    Attributes:
        kind: ``fraction`` (a compute fraction and/or GPU memory, the fractional-GPU
            model of Ray and KAI), ``time_slice`` (replicas of a time-sliced card, the
            NVIDIA device plugin's model), ``mps`` (MPS clients of a card) or ``mig``
            (one MIG instance).
        milli: ``fraction``: compute share in 1/1000 GPU (0: memory only);
            ``mps``: each replica's SM percentage x 10 (0: 1000 / the node's
            ``max_clients``, resolved where it lands: ``on``); the replicas on one card
            add up to at most 100% (1000), so that each gets what it was promised.
        mem_mib: GPU memory in MiB the job declares (``mps``: per replica; 0: the
            node's ``max_memory_per_client_mib`` where it lands, else none); the sum of
            declared memory on a card never exceeds the card's memory.
        slots: ``time_slice``: replicas taken; ``mps``: MPS replicas (client slots of
            the card's ``max_clients``) taken.
        profile: ``mig``: the MIG profile name (``1g.10gb``).
        procs: ``mps``: client processes the job runs on its replicas (they share its
            SMs and memory: each is limited to 1/``procs`` of them; note 037).
    """

    kind: str
    milli: int = 0
    mem_mib: int = 0
    slots: int = 1
    profile: str = ""
    procs: int = 1

    def on(self, node) -> "GpuShare":
        """The share as it is on ``node`` (a ``model.cluster.Node``, or ``None``: as
        declared): an MPS share's default SM percentage and memory filled in from the
        node's ``mps_clients`` and ``mps_mem_mib`` (note 037)."""
        if self.kind != "mps" or node is None or (self.milli and (self.mem_mib or not node.mps_mem_mib)):
            return self
        milli = self.milli or (1000 // node.mps_clients if node.mps_clients else 0)
        return GpuShare("mps", milli=milli, mem_mib=self.mem_mib or node.mps_mem_mib, slots=self.slots,
                        procs=self.procs)

    def need(self, node=None) -> tuple[int, int, int]:
        """What it takes of a card (of ``node``: ``on``): ``(milli, MiB, slots)`` (not
        for ``mig``)."""
        if self.kind == "mps":
            s = self.on(node)
            return s.milli * s.slots, s.mem_mib * s.slots, s.slots
        if self.kind == "time_slice":
            return 0, self.mem_mib, self.slots
        return self.milli, self.mem_mib, 0

    def __str__(self) -> str:
        if self.kind == "mig":
            return f"mig:{self.profile}"
        parts = [self.kind]
        if self.milli and self.kind == "fraction":
            parts.append(f"{self.milli / 1000:g}")
        if self.kind == "mps":
            parts.append(f"{self.slots}x{self.milli / 10:g}%" if self.milli else f"{self.slots}x")
            if self.procs != 1:
                parts.append(f"{self.procs}procs")
        if self.kind == "time_slice":
            parts.append(f"{self.slots} replica" + ("s" if self.slots != 1 else ""))
        if self.mem_mib:
            parts.append(f"{self.mem_mib}MiB")
        return ":".join(parts)


_MPS_TEXT = re.compile(r"mps:(\d+)x(\d+(?:\.\d+)?)%(?::(\d+)procs)?(?::(\d+)MiB)?")


def mps_env(share: str) -> dict[str, str]:
    """The MPS client limits for a placement's share text (``str(GpuShare.on(node))``,
    ``mps:2x25%:4procs:4096MiB``): ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (the job's SM
    percentage - replicas x each replica's - over its client processes, floored to 0.1)
    and, when it has a memory figure, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (its replicas'
    memory over its processes, on device 0 as the job sees its one GPU). Empty for any
    other share (note 037)."""
    m = _MPS_TEXT.fullmatch(share)
    if m is None:
        return {}
    replicas, pct, procs, mem = int(m[1]), float(m[2]), int(m[3] or 1), int(m[4] or 0)
    out = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": f"{int(replicas * pct * 10 // procs) / 10:g}"}
    if mem:
        out["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={replicas * mem // procs}M"
    return out


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a user submits. The scheduler never sees a job's true duration.

    Attributes:
        id: unique job id.
        user: submitting user (per-user limits).
        team: team (account) charged for the job's GPUs.
        workload_class: workload class name from the policy (``training`` ...).
        gpus: whole GPUs requested in total (>= 1).
        gpus_per_pod: for a gang of pods, GPUs of each pod (each pod on one node,
            pods may share a node); ``None``: one node when ``gpus`` fits a node,
            otherwise whole nodes plus one remainder node.
        same_node: the whole job must run on one node.
        gpu_mem_mib: minimum memory per GPU in MiB (0: any).
        gpu_types: allowed GPU types (empty: any).
        time_limit_s: the user's time limit in seconds; the job is stopped when it
            runs this long (``None``: the class's max runtime, if any).
        runtime_estimate_s: the user's or a predictor's estimate of the run time,
            used for reservations and backfill (``None``: the time limit).
        preemptible / checkpointable: ``None`` takes the workload class's default.
        submit_time: submit time, seconds on the scheduler's time axis.
        deadline: when the job must be done, seconds on the same axis (``None``: no
            deadline). A job that cannot end by it - by its runtime estimate or time
            limit - is flagged at submit and at each start; it is not refused.
        share: part of one GPU instead of whole GPUs (``gpus`` is then 1); see
            ``GpuShare``.
        node_selector: ``(label, value)`` pairs a node must carry (Kubernetes'
            nodeSelector).
        tolerations: taints (``key=value`` or ``key``) the job tolerates; a node with a
            taint the job does not tolerate is not used (NoSchedule).
        min_driver: lowest NVIDIA driver version the job accepts (``"535.104"``; '':
            any); compared numerically part by part.
        cache_key: a model or dataset the job reads; nodes that report it cached are
            preferred (or required with ``cache_required``).
        project: free-form project the job's GPU-hours are reported under (Slurm's
            ``--wckey``, a Kubernetes label; '': none, shown as ``-``). Showback only:
            the core carries it and never reads it (note 010, "A project on every job").
        name: the job's name (Slurm's ``--job-name``; '': none, shown as ``-``). Shown
            only: the core carries it and never reads it (note 020).
        mem_mib: host memory (RAM) limit in MiB of the job's processes together (0:
            none); ``cpus``: their CPU limit in CPUs (0.0: none). Enforced by the local
            backend's cgroup (``memory.max`` / ``cpu.max``, note 023); the core carries
            them and never reads them (no host memory or CPU scheduling).
        grace_period_s: the grace its stops get, seconds: at most its class's
            ``grace_period_s``, which is the default (``None``); as the class's, only a
            job that checkpoints gets one (Kubernetes' ``terminationGracePeriodSeconds``
            per pod; note 027).
        nice: a priority adjustment in score points, subtracted from the job's
            priority (Slurm's ``nice``: positive lowers it; a negative one, an admin's
            nudge, raises it). 0 at submit; changed by ``JobUpdated`` (note 039).
        require_island: a multi-GPU job's GPUs must lie in one NVLink island of one
            node (it waits rather than span islands; note 037); ``None``: its class's
            ``require_island``.
    """

    id: str
    team: str
    workload_class: str
    gpus: int
    user: str = ""
    gpus_per_pod: int | None = None
    same_node: bool = False
    gpu_mem_mib: int = 0
    gpu_types: tuple[str, ...] = ()
    time_limit_s: float | None = None
    runtime_estimate_s: float | None = None
    preemptible: bool | None = None
    checkpointable: bool | None = None
    submit_time: float = 0.0
    deadline: float | None = None
    share: GpuShare | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[str, ...] = ()
    min_driver: str = ""
    cache_key: str = ""
    cache_required: bool = False
    project: str = ""
    name: str = ""
    mem_mib: int = 0
    cpus: float = 0.0
    grace_period_s: float | None = None
    nice: int = 0
    require_island: bool | None = None

    @property
    def one_node(self) -> bool:
        """Whether the whole job must run on one node: ``same_node``, or a single pod
        (``gpus_per_pod`` >= ``gpus``) - a pod never spans nodes (Kubernetes), nor does a
        Slurm task (``--gpus-per-task`` equal to ``--gpus``)."""
        return self.same_node or (self.gpus_per_pod is not None and self.gpus_per_pod >= self.gpus)

    @property
    def pods(self) -> int:
        if self.gpus_per_pod:
            return self.gpus // self.gpus_per_pod
        return 1

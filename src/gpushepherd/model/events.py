"""Events: everything that happens to the scheduler comes in as one of these.

Events with the same time are applied in a fixed order before the scheduling pass
(``rank``): job exits first, then hardware and operator actions, then submissions
(job id ascending), then one pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gpushepherd.model.cluster import Node
from gpushepherd.model.job import ExitStatus, JobSpec
from gpushepherd.model.placement import Placement


@dataclass(frozen=True, slots=True)
class Event:
    t: float
    rank: ClassVar[int] = 9

    def sort_key(self) -> tuple:
        return (self.t, self.rank)


@dataclass(frozen=True, slots=True)
class JobFinished(Event):
    """A running (or preempting) job's process ended with ``status``."""

    job_id: str = ""
    status: ExitStatus = ExitStatus.COMPLETED
    rank: ClassVar[int] = 0


@dataclass(frozen=True, slots=True)
class NodeAdded(Event):
    node: Node | None = None
    rank: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class NodeLost(Event):
    """The node is gone; its jobs are requeued."""

    node: str = ""
    rank: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class GpuHealthChanged(Event):
    """One GPU became unhealthy (never allocated again until healthy) or healthy."""

    node: str = ""
    gpu: int = 0
    healthy: bool = False
    rank: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class MigReconfigured(Event):
    """The driver has applied a ``ReconfigureMig``: GPU ``gpu`` of ``node`` now has
    ``layout`` (``((start, profile), ...)``) and is back in service."""

    node: str = ""
    gpu: int = 0
    layout: tuple[tuple[int, str], ...] = ()
    rank: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class GpuUnmanaged(Event):
    """GPU ``gpu`` of ``node`` runs compute processes the scheduler did not start
    (``unmanaged=True``): it is not handed out until reported free again
    (``unmanaged=False``). Jobs already holding it keep it."""

    node: str = ""
    gpu: int = 0
    unmanaged: bool = True
    rank: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class UsageSample(Event):
    """What a running job did on its GPUs since the last sample: ``gpu_util_pct``
    (0-100, the mean SM utilisation over its GPUs; for a share, of its card) and
    ``mem_used_mib`` (GPU memory its processes hold now, MiB, summed over its GPUs).
    Feeds idle detection and the peak-memory check. A no-op for a job not holding
    GPUs."""

    job_id: str = ""
    gpu_util_pct: float = 0.0
    mem_used_mib: int = 0
    rank: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class JobCancelled(Event):
    job_id: str = ""
    rank: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class JobRequeueRequested(Event):
    """An operator asks to requeue a running job (Slurm's ``scontrol requeue``).

    A no-op for a job that is not running (completed, pending, gone).
    """

    job_id: str = ""
    rank: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class JobUpdated(Event):
    """An operator or the job's user changes a job after submit (Slurm's ``scontrol
    update``, design note 039): its time limit ``time_limit_s`` (seconds, at most its
    class's ``max_runtime_s``) and/or its ``nice`` (a priority adjustment in score
    points, subtracted from its priority as Slurm's ``nice``); ``None``: unchanged.
    ``admin``: who asks may raise the time limit and lower the nice; otherwise only the
    reverse is allowed (Slurm's rule for users). A pending job is re-queued in its new
    order; a running job's planned end and time-limit stop move (a limit at or below
    the time it has run stops it at once, with its grace). A no-op for a job that ended
    or is unknown."""

    job_id: str = ""
    time_limit_s: float | None = None
    nice: int | None = None
    admin: bool = True
    rank: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class JobAdopted(Event):
    """A job found already running on ``placement`` (a re-attach after a restart, or a
    scenario's initial allocation): the core takes it over as RUNNING since
    ``started_at`` (default: ``t``). Its GPUs must be free."""

    spec: JobSpec | None = None
    placement: Placement | None = None
    started_at: float | None = None
    rank: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class JobSubmitted(Event):
    spec: JobSpec | None = None
    rank: ClassVar[int] = 2


@dataclass(frozen=True, slots=True)
class Tick(Event):
    """Time passes; the core checks its timers (time limits, grace periods)."""

    rank: ClassVar[int] = 3

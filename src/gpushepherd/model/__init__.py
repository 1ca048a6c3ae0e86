"""Value types shared by every room of gpushepherd.

Nothing here does I/O or reads a clock. Times are seconds (float) on the
scheduler's own time axis (the simulator's trace time, the daemon's epoch
seconds); GPU memory is MiB; usage is GPU-seconds.
"""

from gpushepherd.model.cluster import Node
from gpushepherd.model.decisions import Decision, Preempt, Start, Stop
from gpushepherd.model.events import (
    Event,
    GpuHealthChanged,
    JobAdopted,
    JobCancelled,
    JobFinished,
    JobRequeueRequested,
    JobSubmitted,
    JobUpdated,
    NodeAdded,
    NodeLost,
    Tick,
)
from gpushepherd.model.job import ExitStatus, JobSpec, JobState
from gpushepherd.model.placement import Placement
from gpushepherd.model.reasons import PendingReason, ReasonCode

__all__ = [
    "Decision",
    "Event",
    "ExitStatus",
    "GpuHealthChanged",
    "JobAdopted",
    "JobCancelled",
    "JobFinished",
    "JobRequeueRequested",
    "JobSpec",
    "JobState",
    "JobSubmitted",
    "JobUpdated",
    "Node",
    "NodeAdded",
    "NodeLost",
    "PendingReason",
    "Placement",
    "Preempt",
    "ReasonCode",
    "Start",
    "Stop",
    "Tick",
]

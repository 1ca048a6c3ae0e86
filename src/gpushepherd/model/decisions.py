"""Decisions: what the core tells its driver (simulator, daemon, backend) to do."""

from __future__ import annotations

from dataclasses import dataclass

from gpushepherd.model.placement import Placement


@dataclass(frozen=True, slots=True)
class Decision:
    t: float
    job_id: str


@dataclass(frozen=True, slots=True)
class Start(Decision):
    """Start the job on ``placement`` now."""

    placement: Placement | None = None


@dataclass(frozen=True, slots=True)
class Preempt(Decision):
    """Signal the job; it keeps its GPUs for ``grace_s`` seconds (to checkpoint), then
    must exit. The driver reports the exit as ``JobFinished(status=PREEMPTED)``; the
    job is then requeued. ``preemptor`` is the job the GPUs are freed for."""

    grace_s: float = 0.0
    reason: str = ""
    preemptor: str = ""


@dataclass(frozen=True, slots=True)
class Stop(Decision):
    """Stop the job for ``reason`` (``time-limit``, ``node-lost``, ``gpu-failed``,
    ``requeue``, ``cancelled``) after ``grace_s`` seconds. With ``requeue`` the core has
    already put the job back in its queue and released its GPUs (the node or GPU is
    gone, or an operator asked); otherwise the driver reports the exit."""

    reason: str = ""
    grace_s: float = 0.0
    requeue: bool = False


@dataclass(frozen=True, slots=True)
class Reject(Decision):
    """The job was refused at submit: no node of the inventory could ever hold it
    (``reason`` says which constraint). It never runs; its state is ``REJECTED``."""

    reason: str = ""


@dataclass(frozen=True, slots=True)
class ReconfigureMig(Decision):
    """Re-partition idle MIG GPU ``gpu`` of ``node`` into ``layout`` (``((start,
    profile), ...)``), for pending job ``job_id`` first. The GPU serves nobody until the
    driver reports ``MigReconfigured``."""

    node: str = ""
    gpu: int = 0
    layout: tuple[tuple[int, str], ...] = ()

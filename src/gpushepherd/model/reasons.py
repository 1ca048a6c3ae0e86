"""Why a job waits: reason codes in the order of precedence the core applies them."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class ReasonCode(str, enum.Enum):
    """Pending-reason codes (Slurm's ``Resources`` / ``Priority`` where they fit).

    Precedence when several apply (the core reports the first that holds):
    hard limits (``ExceedsCapacity``, ``QuotaExceeded``, ``WindowLimit``) ->
    capacity (``Resources``, ``CohortQuota``, ``NoFit``, ``NoPreemptibleVictims``) ->
    holds (``ReservedFor``, ``HeldForPreemptor``, ``PreemptionInProgress``, ``Priority``).
    """

    #: can never run on this cluster/policy (more GPUs than any allowed placement or limit)
    EXCEEDS_CAPACITY = "ExceedsCapacity"
    #: a quota or limit of the policy would be exceeded; detail names the policy field
    QUOTA_EXCEEDED = "QuotaExceeded"
    #: a limit of the time window in force would be exceeded
    WINDOW_LIMIT = "WindowLimit"
    #: not enough free GPUs in total on the nodes the job may use
    RESOURCES = "Resources"
    #: the GPUs are free, but the team's cohort has lent or used all it has (Kueue's
    #: "insufficient unused quota in cohort"); detail names the cohort limit
    COHORT_QUOTA = "CohortQuota"
    #: enough free GPUs in total, but not in the shape the job needs; detail names it
    NO_FIT = "NoFit"
    #: evicting lower-priority work would make room, but none of it may be preempted
    NO_PREEMPTIBLE_VICTIMS = "NoPreemptibleVictims"
    #: starting now would delay a higher-priority job's reservation (backfill rule)
    RESERVED_FOR = "ReservedFor"
    #: the free GPUs are held for a job whose preemption victims are still exiting
    HELD_FOR_PREEMPTOR = "HeldForPreemptor"
    #: this job's preemption victims are inside their grace period
    PREEMPTION_IN_PROGRESS = "PreemptionInProgress"
    #: behind an earlier job of a strict-FIFO queue
    PRIORITY = "Priority"
    #: not looked at yet (submitted since the last scheduling pass)
    NEW = "New"


@dataclass(frozen=True, slots=True)
class PendingReason:
    """A reason code and the object that blocks the job (quota path, job id, constraint)."""

    code: ReasonCode
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.code.value}({self.detail})" if self.detail else self.code.value


def time_text(t: float) -> str:
    """A time point as a reason or a job's log names it: in the driver's seconds (the
    simulator's from 0, the daemon's since the epoch), rounded up to the millisecond so
    the instant named is never before the one meant, without trailing zeros
    (``15``, ``60.5``, ``1796541064.201``). ``:g`` kept 6 digits: an epoch time read
    ``1.79654e+09``, a day before the event."""
    return f"{math.ceil(round(t * 1000, 6)) / 1000:.3f}".rstrip("0").rstrip(".")

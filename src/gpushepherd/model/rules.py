"""The compiled policy: what the core reads. Built by ``gpushepherd.policy`` from a
validated policy file; plain frozen data, no validation logic here."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from gpushepherd.model.cluster import Node


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
    """

    path: str
    max: int
    unit: LimitUnit = LimitUnit.GPUS
    team: str | None = None
    workload_class: str | None = None
    per_user: bool = False


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
    default_team: str | None = None

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

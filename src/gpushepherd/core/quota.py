"""Quotas and limits: what a set of running jobs may hold at once.

Each ``Limit`` of the policy (team max GPUs, per-user caps, class caps, running-job
counts, a parent team's caps) is a counter keyed by the limit and, for per-user
limits, the user. Admission asks every limit that counts the job whether
``usage + amount <= max`` (Kueue's ClusterQueue ``nominalQuota`` check and Slurm's
``GrpTRES`` / ``MaxTRESPerUser`` association limits work the same way).

GPU limits count in ``GPU_UNITS`` (7000) per GPU, so that fractions (milli-GPU x 7),
MIG instances (compute slices x 1000) and whole GPUs are exact integers; ``fmt``
turns a count back into GPUs for reasons.
"""

from __future__ import annotations

from gpushepherd.model.job import GPU_UNITS
from gpushepherd.model.rules import Limit, LimitUnit, Rules, week_values

#: (limit index, user or "", amount)
Charge = tuple[int, str, int]


class QuotaBook:
    """Usage counters for every limit of the policy."""

    def __init__(self, rules: Rules):
        self.rules = rules
        self.limits: tuple[Limit, ...] = rules.limits
        self.usage: dict[tuple[int, str], int] = {}
        self._applicable: dict[tuple[str, str], tuple[int, ...]] = {}
        #: each limit's value now, and the window that gives it ('' outside windows)
        self.scale: list[int] = [GPU_UNITS if lim.unit is LimitUnit.GPUS else 1 for lim in self.limits]
        self.current: list[int] = [lim.max * sc for lim, sc in zip(self.limits, self.scale)]
        self.window: list[str] = [""] * len(self.limits)
        self.windowed: tuple[int, ...] = tuple(i for i, lim in enumerate(self.limits) if lim.windows)
        self._windowed_set = frozenset(self.windowed)
        self._together: dict[tuple, tuple[int, ...] | None] = {}
        #: cohort capacity limits: a capacity reason, not a hard limit (they can be
        #: freed by reclaiming borrowed GPUs)
        self.cohort_limits = frozenset(i for i, lim in enumerate(self.limits) if lim.cohort)

    def set_time(self, t: float) -> list[tuple[int, int, int]]:
        """Bring windowed limits to their value at ``t``; returns ``(limit, old, new)``
        for each that changed."""
        changes = []
        clock = self.rules.clock
        for i in self.windowed:
            value, name = self.limits[i].at(clock, t)
            value *= self.scale[i]
            self.window[i] = name
            if value != self.current[i]:
                changes.append((i, self.current[i], value))
                self.current[i] = value
        return changes

    def applicable(self, team: str, workload_class: str, evictable: bool = True,
                   gpu_type: str | None = None) -> tuple[int, ...]:
        """Indices of the limits a job of this team and class counts in (``gpu_type``:
        placed on that GPU type - the per-type limits of that type count it too, note
        038; ``None``: only the limits of every type)."""
        key = (team, workload_class, evictable, gpu_type)
        found = self._applicable.get(key)
        if found is None:
            chain = set(self.rules.ancestors(team))
            cls = self.rules.classes.get(workload_class)
            pools = cls.pools if cls is not None else None
            found = tuple(
                i for i, lim in enumerate(self.limits)
                if (lim.team is None or lim.team in chain)
                and (not lim.members or any(m in chain for m in lim.members))
                and (lim.pools is None or (pools is not None and set(pools) <= set(lim.pools)))
                and (lim.workload_class is None or lim.workload_class == workload_class)
                and not (lim.unevictable_only and evictable)
                and (lim.gpu_type is None or lim.gpu_type == gpu_type)
            )
            self._applicable[key] = found
        return found

    def fmt(self, i: int, value: int) -> str:
        """A count of limit ``i`` in the policy's unit (GPUs, or jobs)."""
        if self.scale[i] == 1:
            return str(value)
        return f"{value / self.scale[i]:.4g}" if value % self.scale[i] else str(value // self.scale[i])

    def charges(self, team: str, workload_class: str, user: str, units: int,
                evictable: bool = True, gpu_type: str | None = None) -> tuple[Charge, ...]:
        """What a job of this team, class, user and size (``units``: GPU units, 7000
        per GPU) counts against each limit (``evictable``: whether it may be
        preempted, which some limits ask; ``gpu_type``: the type it is placed on)."""
        out = []
        for i in self.applicable(team, workload_class, evictable, gpu_type):
            lim = self.limits[i]
            amount = units if lim.unit is LimitUnit.GPUS else 1
            out.append((i, user if lim.per_user else "", amount))
        return tuple(out)

    def never_fits(self, charges: tuple[Charge, ...]) -> Limit | None:
        """A limit whose loosest value (over its windows) is below the job's own amount:
        it can never start."""
        for i, _user, amount in charges:
            if amount > self.limits[i].loosest * self.scale[i]:
                return self.limits[i]
        return None

    def never_together(self, charges: tuple[Charge, ...]) -> tuple[int, ...] | None:
        """A least set of two or more windowed limits whose windows never allow the
        job's amounts at the same time (each alone may: ``never_fits`` found none), as
        limit indices in policy order - every limit of it is a blocker: with any one of
        them raised the others allow it some time (a limit whose windows open with the
        rest's is no part of it); ``None`` if some stretch of the week allows them all."""
        wins = tuple((i, a) for i, _u, a in charges if i in self._windowed_set)
        if len(wins) < 2:
            return None
        key = tuple((self.limits[i], a) for i, a in wins)
        found = self._together.get(key, -1)
        if found == -1:
            found = None
            if not self._allowed(wins):
                # drop each limit (policy order) whose removal leaves a set still never
                # allowed: what stays is minimal (a superset of a never-allowed set is one)
                kept = list(wins)
                for w in wins:
                    rest = [x for x in kept if x is not w]
                    if not self._allowed(rest):
                        kept = rest
                found = tuple(i for i, _a in kept)
            self._together[key] = found
        return found

    def _allowed(self, wins) -> bool:
        """Whether some stretch of the week allows every ``(limit index, amount)``."""
        combos = week_values(tuple(self.limits[i] for i, _a in wins))
        return any(all(a <= v * self.scale[i] for (i, a), v in zip(wins, combo)) for combo in combos)

    def blocking(self, charges: tuple[Charge, ...], cohort: bool = False) -> tuple[int, int] | None:
        """The first limit (policy order) the job would exceed now: ``(limit index,
        usage)``; hard limits only, or with ``cohort`` cohort capacity limits only."""
        usage = self.usage
        current = self.current
        cohorts = self.cohort_limits
        for i, user, amount in charges:
            if (i in cohorts) != cohort:
                continue
            used = usage.get((i, user), 0)
            if used + amount > current[i]:
                return i, used
        return None

    def charge(self, charges: tuple[Charge, ...], sign: int) -> None:
        """Add (``sign`` 1) or remove (-1) a job's usage. Raises ``AssertionError`` if a
        counter would go negative (a usage is never subtracted twice)."""
        usage = self.usage
        for i, user, amount in charges:
            key = (i, user)
            new = usage.get(key, 0) + sign * amount
            if new < 0:
                raise AssertionError(f"usage of {self.limits[i].path} for {user or '*'} would be {new}")
            if new:
                usage[key] = new
            else:
                usage.pop(key, None)

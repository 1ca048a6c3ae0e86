"""Decayed GPU usage and the fair-share factor.

Usage is GPU-seconds held, decaying exponentially with a half-life ``H`` (Slurm's
PriorityDecayHalfLife; Kueue's admission fair sharing decays the same way). Each entity
(the cluster, a team, a user of a team) keeps ``(V, t, g)``: its decayed usage ``V`` at
time ``t`` and the GPUs ``g`` it holds since then, so that at any later ``t'``

    usage(t') = V * 2^(-(t'-t)/H) + g * (H / ln 2) * (1 - 2^(-(t'-t)/H))

exactly (the integral of ``g`` decayed to ``t'``). Usage is never negative.

The fair-share factor is Slurm's classic ``F = 2^(-U/S)``: ``U`` the entity's share of
its parent's decayed usage, ``S`` its share of the parent's shares.
"""

from __future__ import annotations

import math

LN2 = math.log(2.0)


class UsageBook:
    """Decayed usage per entity key (``("all",)``, ``("team", t)``, ``("user", t, u)``)."""

    def __init__(self, half_life_s: float, unit: int = 1):
        """``unit``: holds are integers in 1/``unit`` GPU (the core uses 7000 per GPU,
        so that shares add and subtract exactly); values are GPU-seconds."""
        if not half_life_s > 0:
            raise ValueError("half_life_s must be > 0")
        self.half_life = float(half_life_s)
        self._k = self.half_life / LN2 / unit
        self.entries: dict[tuple, list[float]] = {}  # key -> [V, t, units held (an exact integer)]

    def _at(self, entry: list[float], t: float) -> float:
        v, t0, g = entry
        dt = t - t0
        if dt <= 0:
            return v
        decay = 2.0 ** (-dt / self.half_life)
        return v * decay + g * self._k * (1.0 - decay)

    def value(self, key: tuple, t: float) -> float:
        """Decayed GPU-seconds of ``key`` at ``t`` (0 for an unknown key)."""
        entry = self.entries.get(key)
        return 0.0 if entry is None else self._at(entry, t)

    def hold(self, keys: tuple[tuple, ...], t: float, gpus: int) -> None:
        """``keys`` start (``gpus`` > 0) or stop (< 0) holding ``gpus`` units (GPUs x
        ``unit``) at ``t``."""
        for key in keys:
            entry = self.entries.get(key)
            if entry is None:
                entry = self.entries[key] = [0.0, t, 0]
            else:
                entry[0] = self._at(entry, t)
                entry[1] = max(entry[1], t)
            entry[2] += gpus
            if entry[2] < 0:  # pragma: no cover - a broken invariant, not an input error
                raise AssertionError(f"usage rate of {key} went negative")

    def snapshot(self, t: float) -> list[list]:
        """``[[key..., usage at t], ...]`` sorted (the GPUs held are restored from the
        running jobs themselves)."""
        return [[*key, self._at(e, t)] for key, e in sorted(self.entries.items())]

    def restore(self, rows: list[list], t: float) -> None:
        """Load ``snapshot(t)`` rows as the usage at ``t`` (GPUs held: none until the
        running jobs are re-occupied). Raises ``ValueError`` for a negative usage."""
        for row in rows:
            key, value = tuple(row[:-1]), float(row[-1])
            if value < 0:
                raise ValueError(f"snapshot: usage of {key} is negative")
            self.entries[key] = [value, t, 0]


    def exact(self) -> list[list]:
        """``[[key..., V, t], ...]`` sorted: each entry as kept - its usage ``V`` at ``t``,
        from which it decays - for ``settle``."""
        return [[*key, e[0], e[1]] for key, e in sorted(self.entries.items())]

    def settle(self, rows: list[list]) -> None:
        """Put back each entry's ``V`` and ``t`` of ``exact()`` rows (after ``restore`` and
        the running jobs' holds): the same usage, decayed from the same instant, so that
        it reads later to the last bit as in the core the rows were taken from (decayed
        from the snapshot's instant instead, a fair-share score differed in the 16th
        digit and two jobs swapped places; oracle seed 122739)."""
        for row in rows:
            entry = self.entries.get(tuple(row[:-2]))
            if entry is not None:
                entry[0], entry[1] = float(row[-2]), float(row[-1])


def factor(usage: float, parent_usage: float, share: float) -> float:
    """``2^(-U/S)``: ``U`` = usage / parent usage (0 when the parent has none), ``S`` = share (0 < S <= 1)."""
    if parent_usage <= 0 or share <= 0:
        return 1.0
    return 2.0 ** (-(usage / parent_usage) / share)

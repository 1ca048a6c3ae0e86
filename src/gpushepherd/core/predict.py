"""Runtime predictions from finished jobs (issue #3: the policy sees the user's time
limit, or a prediction learned from the same user's or team's finished jobs).

Users over-estimate their time limits by a factor that is typical of the user
(Tsafrir, Etsion and Feitelson, "Backfilling Using System-Generated Predictions Rather
Than User Runtime Estimates", IEEE TPDS 2007, predict from the user's last jobs). Here
a completed job teaches the ratio ``run time / time limit`` of its user and its team
(the last ``history`` of each); a new job with a time limit and no estimate of its own
is predicted ``limit x q``, ``q`` the ``quantile`` of its user's ratios - of its team's
when the user has fewer than ``min_jobs`` - never above the limit and never below 1 s.
A job that outruns its prediction keeps running until its time limit; reservations
that counted on its end are recomputed (it is taken to end now, as any late job).

Under ``priority.weights.deadline`` the ratios are kept without ``prediction.enabled``
too (``predicts`` false: nothing is predicted): the deadline factor reads a job's chance
to end in time from them (note 068).

Deterministic: ratios are kept in completion order; the quantile is the nearest rank.
"""

from __future__ import annotations

import math
from collections import deque


class RuntimePredictor:
    """Ratios of run time to time limit per user and team; predictions from them."""

    def __init__(self, quantile: float = 0.9, history: int = 20, min_jobs: int = 3, predicts: bool = True):
        self.quantile = quantile
        #: False: ratios are kept (the deadline factor's chances, note 068), nothing predicted
        self.predicts = predicts
        self.history = history
        self.min_jobs = min_jobs
        self.ratios: dict[tuple[str, ...], deque[float]] = {}

    def observe(self, team: str, user: str, limit_s: float | None, ran_s: float) -> None:
        """A job of ``team``/``user`` with time limit ``limit_s`` completed after
        ``ran_s`` seconds of run time (all its runs together)."""
        if not limit_s or ran_s < 0:
            return
        ratio = min(1.0, ran_s / limit_s)
        for key in (("user", team, user), ("team", team)):
            q = self.ratios.get(key)
            if q is None:
                q = self.ratios[key] = deque(maxlen=self.history)
            q.append(ratio)

    def ratios_for(self, team: str, user: str) -> list[float] | None:
        """The ratios a prediction for ``team``/``user`` rests on, sorted (the user's, else
        the team's when the user has fewer than ``min_jobs``); ``None``: too little history."""
        for key in (("user", team, user), ("team", team)):
            q = self.ratios.get(key)
            if q is not None and len(q) >= self.min_jobs:
                return sorted(q)
        return None

    def predict(self, team: str, user: str, limit_s: float | None) -> float | None:
        """Predicted run time in seconds, or ``None`` (no limit, or too little history)."""
        if not limit_s or not self.predicts:
            return None
        ranked = self.ratios_for(team, user)
        if ranked is None:
            return None
        r = ranked[min(len(ranked) - 1, max(0, math.ceil(self.quantile * len(ranked)) - 1))]
        return max(1.0, min(limit_s, limit_s * r))

    def snapshot(self) -> list[list]:
        """``[[kind, team, (user,) [ratios...]], ...]`` sorted by key, ratios oldest first."""
        return [[*key, list(q)] for key, q in sorted(self.ratios.items())]

    def restore(self, rows: list[list]) -> None:
        """Load ``snapshot()`` rows (the last ``history`` ratios of each key are kept)."""
        for row in rows:
            key, values = tuple(row[:-1]), row[-1]
            self.ratios[key] = deque((float(v) for v in values), maxlen=self.history)

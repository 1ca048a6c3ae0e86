"""Tail figures per job size class, and fairness across users (design note 030).

One function, ``tail_figures``, computes them for every surface: ``shepherd simulate``
(``gpushepherd.sim.metrics.summarize``), ``bench/compare.py`` rows, ``shepherd report``
(``gpushepherd.report.figures``) and the server's ``/metrics``
(``gpushepherd.daemon.metrics``). Each surface only says what a job's GPUs, wait,
completion time and run time were.

Definitions:

* **size class** of a job by its GPUs (a share of one GPU counts as 1): ``1`` (at most
  one GPU), ``2-4``, ``5-8`` (8: one full node of the usual 8-GPU server), ``9-15``,
  ``16+`` (``SIZE_CLASSES``). Every GPU count is in exactly one class.
* **wait** = first start - submit, over the jobs that started; jobs not started are
  counted (``not_started``), their wait is not known yet.
* **slowdown** = bounded slowdown, ``max(1, JCT / max(run, SLOWDOWN_FLOOR_S))``, over
  the jobs that ended (completed, failed, timed out): JCT = end - submit; ``run`` is
  the time the job needs on GPUs (the simulator: its true duration; a live server and
  its report: the seconds its runs held GPUs). The floor keeps a 1-second job that
  waited a minute from counting as 60x slower (Feitelson's bounded slowdown, 10 s).
* **mean / p90 / p99 / max** of each; p90 and p99 are numpy's linear interpolation
  (p90 too, because a tenth of a class waiting for days hides under a p99 of a few
  extreme jobs and a mean of mostly zeros: issue 17, point 4).
* **fairness across users** = Jain's index, ``(sum x)^2 / (n * sum x^2)``, over ``x`` =
  each user's mean slowdown, users with at least ``FAIR_MIN_JOBS`` ended jobs: 1 when
  every user's jobs are slowed alike, towards ``1/n`` when one user's jobs bear the
  waiting. Slowdown, not wait or JCT, because users differ in how long their jobs run;
  a scheduler that treats them alike gives them alike slowdowns, not alike waits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

#: the size classes, smallest first (labels of ``/metrics`` and keys of the figures)
SIZE_CLASSES = ("1", "2-4", "5-8", "9-15", "16+")
_UPPER = (1.0, 4.0, 8.0, 15.0)  # largest GPU count of each class but the last
#: seconds: the run time below which a job's slowdown is taken against this instead
SLOWDOWN_FLOOR_S = 10.0
#: ended jobs a user needs to count in the fairness index (fewer: one job's luck)
FAIR_MIN_JOBS = 5


def size_class(gpus: float) -> str:
    """The size class (``SIZE_CLASSES``) of a job of ``gpus`` GPUs (``> 0``; a share of
    one GPU, below 1, is in ``"1"``).

    Raises:
        ValueError: ``gpus`` not a number > 0.
    """
    if not (isinstance(gpus, int | float) and gpus > 0 and math.isfinite(gpus)):
        raise ValueError(f"gpus: {gpus!r} is not allowed: a number of GPUs > 0")
    for label, upper in zip(SIZE_CLASSES, _UPPER):
        if gpus <= upper:
            return label
    return SIZE_CLASSES[-1]


def slowdown(jct_s: float, run_s: float) -> float:
    """Bounded slowdown of an ended job: ``max(1, jct_s / max(run_s, SLOWDOWN_FLOOR_S))``
    (seconds in, a ratio out)."""
    return max(1.0, jct_s / max(run_s, SLOWDOWN_FLOOR_S))


def _stats(values) -> dict[str, float | None]:
    import numpy as np

    if values.size == 0:
        return {"mean": None, "p90": None, "p99": None, "max": None}
    p90, p99 = np.percentile(values, [90, 99])
    return {"mean": float(values.mean()), "p90": float(p90), "p99": float(p99), "max": float(values.max())}


def jain_index(values: Sequence[float]) -> float | None:
    """Jain's fairness index of ``values`` (>= 0): ``(sum x)^2 / (n * sum x^2)``, from
    ``1/n`` to 1 (all equal); ``None`` for no values or all zero."""
    n = len(values)
    sq = sum(v * v for v in values)
    if n == 0 or sq == 0:
        return None
    return sum(values) ** 2 / (n * sq)


def tail_figures(gpus: Sequence[float], wait_s: Sequence[float], slowdowns: Sequence[float],
                 users: Sequence[str]) -> dict[str, Any]:
    """Tail figures of a set of jobs (module docstring), one entry per job in each
    argument: its GPUs (> 0), its wait in seconds (NaN: not started), its slowdown
    (``slowdown()``; NaN: not ended) and its user.

    Returns ``{"size_classes": {label: {"jobs", "started", "not_started", "ended",
    "wait_s": {"mean", "p90", "p99", "max"}, "slowdown": {"mean", "p90", "p99", "max"}}},
    "fairness": {"index": "jain_user_mean_slowdown", "value", "users", "min_jobs",
    "worst_user", "worst_mean_slowdown"}}``; every size class is present, its figures
    ``None`` without jobs that started (wait) or ended (slowdown).

    Raises:
        ValueError: the arguments differ in length, or a GPU count is not > 0.
    """
    import numpy as np

    n = len(gpus)
    if not (len(wait_s) == len(slowdowns) == len(users) == n):
        raise ValueError(f"tail_figures: {n} gpus, {len(wait_s)} waits, {len(slowdowns)} slowdowns and "
                         f"{len(users)} users are not allowed: one of each per job")
    g = np.asarray(gpus, dtype=float)
    if n and not (np.isfinite(g).all() and (g > 0).all()):
        bad = next(float(v) for v in g if not (math.isfinite(v) and v > 0))
        raise ValueError(f"gpus: {bad!r} is not allowed: a number of GPUs > 0")
    w = np.asarray(wait_s, dtype=float)
    s = np.asarray(slowdowns, dtype=float)
    which = np.searchsorted(np.asarray(_UPPER), g, side="left")  # index into SIZE_CLASSES
    out: dict[str, Any] = {}
    for i, label in enumerate(SIZE_CLASSES):
        m = which == i
        waits, slows = w[m], s[m]
        started, ended = waits[~np.isnan(waits)], slows[~np.isnan(slows)]
        out[label] = {"jobs": int(m.sum()), "started": int(started.size),
                      "not_started": int(m.sum() - started.size), "ended": int(ended.size),
                      "wait_s": _stats(started), "slowdown": _stats(ended)}
    return {"size_classes": out, "fairness": user_fairness(users, s)}


def user_fairness(users: Sequence[str], slowdowns: Sequence[float]) -> dict[str, Any]:
    """Jain's index over the users' mean slowdowns (module docstring; ``slowdowns``
    NaN for jobs not ended), and the worst user (highest mean; ties: the first name)."""
    per: dict[str, list[float]] = {}
    for user, v in zip(users, slowdowns):
        if not math.isnan(v):
            per.setdefault(str(user), []).append(float(v))
    means = {u: sum(vs) / len(vs) for u, vs in sorted(per.items()) if len(vs) >= FAIR_MIN_JOBS}
    worst: tuple[str | None, float | None] = (None, None)
    for u, m in means.items():  # sorted by name: the first of equal means stays
        if worst[1] is None or m > worst[1]:
            worst = (u, m)
    return {"index": "jain_user_mean_slowdown", "value": jain_index(list(means.values())), "users": len(means),
            "min_jobs": FAIR_MIN_JOBS, "worst_user": worst[0], "worst_mean_slowdown": worst[1]}


#: the columns of ``tail_rows``, in order
ROW_COLUMNS = ("size_gpus", "jobs", "started", "not_started", "wait_mean_s", "wait_p90_s", "wait_p99_s", "wait_max_s",
               "ended", "slowdown_mean", "slowdown_p90", "slowdown_p99", "slowdown_max")


def tail_rows(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """``tail_figures(...)`` as table rows, one per size class with jobs (``ROW_COLUMNS``;
    ``None`` where there is nothing to measure)."""
    rows = []
    for label, f in figures["size_classes"].items():
        if not f["jobs"]:
            continue
        w, s = f["wait_s"], f["slowdown"]
        rows.append({"size_gpus": label, "jobs": f["jobs"], "started": f["started"], "not_started": f["not_started"],
                     "wait_mean_s": w["mean"], "wait_p90_s": w["p90"], "wait_p99_s": w["p99"], "wait_max_s": w["max"],
                     "ended": f["ended"], "slowdown_mean": s["mean"], "slowdown_p90": s["p90"],
                     "slowdown_p99": s["p99"], "slowdown_max": s["max"]})
    return rows


def fairness_line(fairness: dict[str, Any]) -> str:
    """One line saying what ``user_fairness`` found."""
    if fairness["value"] is None:
        return f"fairness across users: not measured (no user with {fairness['min_jobs']} or more ended jobs)"
    return (f"fairness across users (Jain's index over each user's mean slowdown, {fairness['users']:,} users with "
            f">= {fairness['min_jobs']} ended jobs; 1 = alike): {fairness['value']:.3f}; worst user "
            f"{fairness['worst_user']}, mean slowdown {fairness['worst_mean_slowdown']:.2f}")

"""The report's figures over a time range ``[from, to)`` of a ``History`` (note 010).

Definitions (so that each figure can be recomputed from the CSV files):

* **GPU-hours** of a run = (its interval clipped to the range) x its GPUs (quota units
  / 7000) / 3600; a run still going at the last event counts up to the last event.
* **cost** = GPU-hours x the policy's price per GPU-hour of the run's GPU type.
* **queueing delay** = first start - submit, over the jobs submitted in the range that
  started before its end; p50 / p95 by numpy's linear interpolation. Of the jobs
  submitted in the range (``submitted``), ``started`` first started before its end
  (once each, whatever happened after), ``rejected`` / ``cancelled_before_start`` ended
  so before the end, ``still_pending`` never started and were PENDING at the end (at
  ``to``, or at the last event if ``to`` is later): ``submitted = started + rejected +
  cancelled_before_start + still_pending``. ``requeued_pending``: of ``started``, those
  PENDING again at the end (preempted and requeued, a lost run), counted in ``started``
  only.
* **pending reasons**: job-hours spent in each reason code inside the range, and the
  reason (code and detail) with the most time.
* **idle gaps**: intervals with >= 1 free GPU while jobs were pending; intervals with no
  GPU held.
* **allocated-but-idle**: GPU-hours of runs inside intervals their usage samples
  called idle (zero without samples).
* **tails by size** and **fairness across users** (``gpushepherd.tails``, note 030):
  over the jobs submitted in the range, the wait of those that started before its end
  and the slowdown of those that ended (completed, failed, timed out) before it, a
  job's run time being the seconds its runs held GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pandas as pd

from gpushepherd.report.history import History
from gpushepherd.tails import ROW_COLUMNS, slowdown, tail_figures, tail_rows

H = 3600.0


@dataclass
class Report:
    """Figures of one range. ``tables``: name -> DataFrame, in print order (one CSV
    each); ``utilisation``: columns ``t, gpus_held, utilisation`` (a step series, value
    from ``t`` to the next row); ``queue``: ``t`` and one column per class (pending
    jobs); ``quota``: per team GPU-hours and what its nominal / max GPUs give over the
    range."""

    t_from: float
    t_to: float
    title: str
    currency: str | None
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    utilisation: pd.DataFrame | None = None
    queue: pd.DataFrame | None = None
    #: GPUs held per team at each ``t`` of ``utilisation`` (one column per team, same rows)
    held_by_team: pd.DataFrame | None = None
    capacity_gpus: float = 0.0  # the cluster's GPUs (the history's capacity)
    quota: pd.DataFrame | None = None
    local: object = None  # t -> datetime (the policy's clock)
    t_end: float = 0.0  # where the series stop: ``t_to``, or the last event if earlier
    t_start: float = 0.0  # where the figures start: ``t_from``, or the first event if later
    #: how plots and pages write times: ``clock`` (dates in the policy's zone) or ``days``
    #: (a simulator run: days from the start of the trace, never 1970 dates; issue 18 point 10)
    time_axis: str = "clock"

    def stamp(self, t: float) -> str:
        """``t`` as the tables write it: ISO 8601 in the policy's zone, or (``days``)
        ``day 45.203`` of the trace."""
        return f"day {t / 86400.0:,.3f}" if self.time_axis == "days" else self.local(t).isoformat(timespec="seconds")

    @property
    def clipped(self) -> str | None:
        """"range clipped to the event log: from ... to ..." when the figures cover less
        than ``[t_from, t_to)`` (the log starts later or ends earlier), else ``None``."""
        if (self.t_start, self.t_end) == (self.t_from, self.t_to):
            return None
        fmt = [self.stamp(t) for t in (self.t_start, self.t_end)]
        return f"range clipped to the event log: from {fmt[0]} to {fmt[1]}"


def _clipped(df: pd.DataFrame, a: float, b: float, t_last: float) -> np.ndarray:
    """Seconds of each interval inside ``[a, b)`` (an open end stops at ``t_last``)."""
    if df.empty:
        return np.zeros(0)
    end = df["end"].fillna(t_last).to_numpy(dtype=float)
    end = np.minimum(end, b)
    start = np.maximum(df["start"].to_numpy(dtype=float), a)
    return np.maximum(0.0, end - start)


def _steps(starts: np.ndarray, ends: np.ndarray, weights: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Sum of ``weights`` of the intervals covering each point of ``grid``."""
    if starts.size == 0:
        return np.zeros(grid.size)
    order_s, order_e = np.argsort(starts, kind="stable"), np.argsort(ends, kind="stable")
    s_sorted, e_sorted = starts[order_s], ends[order_e]
    cum_s = np.concatenate([[0.0], np.cumsum(weights[order_s])])
    cum_e = np.concatenate([[0.0], np.cumsum(weights[order_e])])
    return cum_s[np.searchsorted(s_sorted, grid, side="right")] - cum_e[np.searchsorted(e_sorted, grid, side="right")]


def _spans(df: pd.DataFrame, a: float, b: float, t_last: float) -> tuple[np.ndarray, np.ndarray]:
    end = np.minimum(df["end"].fillna(t_last).to_numpy(dtype=float), b) if not df.empty else np.zeros(0)
    start = np.maximum(df["start"].to_numpy(dtype=float), a) if not df.empty else np.zeros(0)
    keep = end > start
    return start[keep], end[keep]


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


def build_report(hist: History, t_from: float, t_to: float, title: str = "", time_axis: str = "clock",
                 through_end: bool = False) -> Report:
    """All figures of ``hist`` over ``[t_from, t_to)`` (seconds on its axis); times
    written as ``time_axis`` says (``Report.time_axis``). ``through_end``: the jobs'
    events at ``t_to`` itself count too (submits, starts, ends, cancels) - a report whose
    ``to`` is the log's last event by default, so a job cancelled by it is not read as
    pending; the figures over time are the same either way (an instant holds no time).

    Raises:
        ValueError: ``t_from >= t_to``.
    """
    if not t_from < t_to:
        raise ValueError(f"the range [{t_from}, {t_to}) is empty: from must be before to")
    # clip to the part of the range the log covers (review issue 9b): before the first
    # event nothing was recorded, after the last nothing is known yet
    rules = hist.rules
    a = max(t_from, hist.t_first) if hist.t_first < t_to else t_from
    b = min(t_to, max(hist.t_last, a))
    b = t_to if b <= a else b
    clock = rules.clock
    local = (lambda t: datetime.fromtimestamp(clock.epoch + t, clock.tz)) if clock else \
        (lambda t: datetime.fromtimestamp(t))
    pricing = rules.pricing
    rep = Report(t_from, t_to, title, pricing.currency if pricing else None, local=local, t_end=b, t_start=a,
                 time_axis=time_axis)

    held = hist.held.copy()
    held["seconds"] = _clipped(held, a, b, hist.t_last)
    held["gpu_hours"] = held["seconds"] * held["gpus"] / H
    if pricing is not None:
        held["cost"] = held["gpu_hours"] * held["gpu_type"].map(pricing.price).astype(float)
    idle = hist.idle.copy()
    idle["idle_gpu_hours"] = _clipped(idle, a, b, hist.t_last) * idle["gpus"] / H
    idle_by_team = idle.groupby("team")["idle_gpu_hours"].sum()

    def usage(key: str) -> pd.DataFrame:
        cols = ["gpu_hours"] + (["cost"] if pricing is not None else [])
        g = held[held["seconds"] > 0].groupby(key)
        df = g[cols].sum()
        df.insert(0, "jobs", g["job_id"].nunique())
        df["share_pct"] = 100.0 * df["gpu_hours"] / df["gpu_hours"].sum() if len(df) else []
        if key == "team":
            df["idle_gpu_hours"] = idle_by_team.reindex(df.index).fillna(0.0)
        return df.reset_index().sort_values([key]).reset_index(drop=True)

    rep.tables["usage_by_team"] = usage("team")
    parents = {t: rules.ancestors(t)[1:] for t in rep.tables["usage_by_team"]["team"]}
    if any(parents.values()):  # hierarchical teams: a project is a child team (note 010)
        rows: dict[str, float] = {}
        for _, r in rep.tables["usage_by_team"].iterrows():
            for t in rules.ancestors(r["team"]):
                rows[t] = rows.get(t, 0.0) + r["gpu_hours"]
        rep.tables["usage_by_team_with_children"] = pd.DataFrame(sorted(rows.items()),
                                                                 columns=["team", "gpu_hours"])
    rep.tables["usage_by_user"] = usage("user")
    rep.tables["usage_by_class"] = usage("class")
    rep.tables["usage_by_project"] = usage("project")  # "-": jobs without a project
    if pricing is not None:
        cost = held[held["seconds"] > 0].groupby(["team", "gpu_type"])[["gpu_hours", "cost"]].sum().reset_index()
        cost["price_per_gpu_hour"] = cost["gpu_type"].map(pricing.price).astype(float)
        rep.tables["cost_by_team_and_gpu_type"] = cost.sort_values(["team", "gpu_type"]).reset_index(drop=True)

    # waits per class, of jobs submitted in the range; with through_end the events at
    # t_to count too: the first time after it is the cut
    cut = math.nextafter(t_to, math.inf) if through_end else t_to
    jobs = hist.jobs[(hist.jobs["submit"] >= a) & (hist.jobs["submit"] < cut)]
    pending_at_end = _pending_at_end(hist, cut)
    rows = []
    for cls, g in sorted(jobs.groupby("class"), key=lambda kv: kv[0]):
        started = g[g["first_start"].notna() & (g["first_start"] < cut)]
        ended = g[g["end"].notna() & (g["end"] < cut) & (g["first_start"].isna() | (g["first_start"] >= cut))]
        delay = (started["first_start"] - started["submit"]).to_numpy(dtype=float)
        pending = g["job_id"].isin(pending_at_end)
        requeued = int(started["job_id"].isin(pending_at_end).sum())
        rows.append((cls, len(g), len(started), int((delay > 0).sum()), int((ended["state"] == "REJECTED").sum()),
                     int((ended["state"] == "CANCELLED").sum()), int(pending.sum()) - requeued, requeued,
                     float(delay.mean()) if delay.size else None, _pct(delay, 50), _pct(delay, 95),
                     float(delay.max()) if delay.size else None))
    rep.tables["waits_by_class"] = pd.DataFrame(rows, columns=[
        "class", "submitted", "started", "waited", "rejected", "cancelled_before_start", "still_pending",
        "requeued_pending", "wait_mean_s", "wait_p50_s", "wait_p95_s", "wait_max_s"])

    _tails(rep, hist, jobs, cut)

    # top pending reasons by job-seconds
    reasons = hist.reasons.copy()
    reasons["seconds"] = _clipped(reasons, a, b, hist.t_last)
    reasons = reasons[(reasons["seconds"] > 0) & (reasons["reason"] != "New")]
    reasons["code"] = reasons["reason"].str.split("(", n=1).str[0]
    top = reasons.groupby("code").agg(job_hours=("seconds", "sum"), jobs=("job_id", "nunique"))
    top["job_hours"] /= H
    by_detail = reasons.groupby(["code", "reason"])["seconds"].sum().reset_index()
    by_detail = by_detail.sort_values(["code", "seconds", "reason"], ascending=[True, False, True])
    top["most_time_in"] = by_detail.groupby("code")["reason"].first()
    rep.tables["top_pending_reasons"] = top.reset_index().rename(columns={"code": "reason"}).sort_values(
        ["job_hours", "reason"], ascending=[False, True]).reset_index(drop=True)

    _series_and_gaps(rep, hist, a, b)
    _quota(rep, hist, a, b)
    return rep


def _tails(rep: Report, hist: History, jobs: pd.DataFrame, t_to: float) -> None:
    """The size-class tails and the fairness across users of ``jobs`` (module docstring)."""
    held = hist.held[hist.held["job_id"].isin(jobs["job_id"])]
    run_s = (held["end"].fillna(hist.t_last) - held["start"]).groupby(held["job_id"]).sum()
    started = jobs["first_start"].notna() & (jobs["first_start"] < t_to)
    wait = (jobs["first_start"] - jobs["submit"]).where(started)
    ended = jobs["state"].isin(("COMPLETED", "FAILED", "TIMEOUT")) & jobs["end"].notna() & (jobs["end"] < t_to)
    slow = [slowdown(e - s, float(run_s.get(j, 0.0))) if ok else float("nan")
            for j, s, e, ok in zip(jobs["job_id"], jobs["submit"], jobs["end"], ended)]
    fig = tail_figures(jobs["gpus"].tolist(), wait.tolist(), slow, jobs["user"].tolist())
    rep.tables["tails_by_size"] = pd.DataFrame(tail_rows(fig), columns=list(ROW_COLUMNS))
    f = fig["fairness"]
    rep.tables["fairness_across_users"] = pd.DataFrame(
        [(f["index"], f["value"], f["users"], f["min_jobs"], f["worst_user"], f["worst_mean_slowdown"])],
        columns=["index", "value", "users", "min_jobs", "worst_user", "worst_mean_slowdown"])


def _pending_at_end(hist: History, t_to: float) -> set[str]:
    """Jobs PENDING at the end of ``[.., t_to)``: just before ``t_to``, or at the last
    event when ``t_to`` is later (the report never invents the future; note 010, 9a)."""
    pend = hist.pending
    if pend.empty:
        return set()
    if t_to <= hist.t_last:
        mask = (pend["start"] < t_to) & (pend["end"].isna() | (pend["end"] >= t_to))
    else:
        mask = pend["end"].isna()
    return set(pend.loc[mask, "job_id"])


def _series_and_gaps(rep: Report, hist: History, a: float, b: float) -> None:
    a = min(max(a, hist.t_first), b)  # before the first event nothing was recorded, not nothing held
    total = hist.total_gpus
    rep.capacity_gpus = float(total)
    hs, he = _spans(hist.held, a, b, hist.t_last)
    keep_h = _keep(hist.held, a, b, hist.t_last)
    weights = hist.held["gpus"].to_numpy(dtype=float)[keep_h] if keep_h.size else np.zeros(0)
    pend = hist.pending
    ps, pe = _spans(pend, a, b, hist.t_last)
    keep_p = _keep(pend, a, b, hist.t_last)
    classes = pend["class"].to_numpy()[keep_p] if keep_p.size else np.zeros(0, dtype=object)
    grid = np.unique(np.concatenate([[a], hs, he, ps, pe]))
    grid = grid[(grid >= a) & (grid < b)]
    held = _steps(hs, he, weights, grid)
    util = pd.DataFrame({"t": grid, "gpus_held": held, "utilisation": held / total if total else 0.0})
    rep.utilisation = util
    teams = hist.held["team"].to_numpy()[keep_h] if keep_h.size else np.zeros(0, dtype=object)
    rep.held_by_team = pd.DataFrame({team: _steps(hs[teams == team], he[teams == team], weights[teams == team], grid)
                                     for team in sorted(set(teams))}, index=range(grid.size))
    queue = pd.DataFrame({"t": grid})
    for cls in sorted(set(classes)):
        m = classes == cls
        queue[cls] = _steps(ps[m], pe[m], np.ones(int(m.sum())), grid)
    pending = _steps(ps, pe, np.ones(ps.size), grid)
    rep.queue = queue
    ends = np.append(grid[1:], b)
    free = total - held
    rows = []
    for kind, mask in (("free GPUs while jobs pending", (free >= 1 - 1e-9) & (pending > 0)),
                       ("no GPU held", held <= 1e-9)):
        i = 0
        while i < grid.size:
            if not mask[i]:
                i += 1
                continue
            j = i
            while j + 1 < grid.size and mask[j + 1]:
                j += 1
            rows.append((kind, rep.stamp(grid[i]), rep.stamp(ends[j]), (ends[j] - grid[i]) / H,
                         float(free[i:j + 1].min()), int(pending[i:j + 1].max())))
            i = j + 1
    rep.tables["idle_gaps"] = pd.DataFrame(rows, columns=["kind", "from", "to", "hours", "min_free_gpus",
                                                          "max_pending_jobs"])


def _keep(df: pd.DataFrame, a: float, b: float, t_last: float) -> np.ndarray:
    if df.empty:
        return np.zeros(0, dtype=bool)
    end = np.minimum(df["end"].fillna(t_last).to_numpy(dtype=float), b)
    return end > np.maximum(df["start"].to_numpy(dtype=float), a)


def _quota(rep: Report, hist: History, a: float, b: float) -> None:
    rules = hist.rules
    hours = (b - a) / H
    max_gpus = {lim.path.split(".")[1]: lim.max for lim in rules.limits
                if lim.path.startswith("teams.") and lim.path.endswith(".max_gpus") and lim.path.count(".") == 2}
    used = rep.tables["usage_by_team"].set_index("team")["gpu_hours"] if len(rep.tables["usage_by_team"]) \
        else pd.Series(dtype=float)
    teams = sorted(set(used.index) | set(rules.nominal_gpus) | set(max_gpus))
    rep.quota = pd.DataFrame({
        "team": teams,
        "gpu_hours": [float(used.get(t, 0.0)) for t in teams],
        "nominal_gpu_hours": [rules.nominal_gpus[t] * hours if t in rules.nominal_gpus else None for t in teams],
        "max_gpu_hours": [max_gpus[t] * hours if t in max_gpus else None for t in teams],
    })
    rep.tables["usage_against_quota"] = rep.quota

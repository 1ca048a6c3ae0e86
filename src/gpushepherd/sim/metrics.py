"""Figures of a simulation, and the per-job table they are computed from.

Definitions (so that anyone can recompute every figure from the per-job file):

* **JCT** (job completion time) = ``end - submit`` of a job that ended (completed,
  failed or stopped at its time limit); jobs still pending or running at the end of the
  replay, and cancelled ones, are counted apart (``unfinished``).
* **queueing delay** = ``start - submit``, ``start`` being the job's first start.
* **utilisation** = GPU-seconds held by jobs / GPU-seconds of healthy capacity, both
  over ``[first submit, last event]``.
* **makespan** = last event - first submit.
* **lower bound** = mean duration of the finished jobs: no scheduler's average JCT can be
  below it.
* **size classes** and **fairness** (``tails``): ``gpushepherd.tails`` (design note 030),
  the run time of a job's slowdown being its true duration.
* **deadlines** (``deadlines``, note 030): of the jobs with a deadline, ``met`` ended
  (completed, failed, timed out) by it, ``missed`` ended after it, ``not_ended`` did
  not end (cancelled, rejected, still pending or running); ``flagged``: those the
  scheduler flagged at risk (at submit or a start), ``flagged_met``: of them, met.

* **not run** (``not_run``): jobs ``rejected`` at submit (the core's refusal, e.g.
  more GPUs than the nodes they may use have) and jobs that ``never started`` by the
  end of the replay (still pending), each with its most common reasons (a rejected
  job's refusal; a pending job's reason at the end, ``Scheduler.pending_reason``),
  ``[reason, jobs]`` by jobs descending, then reason.

Percentiles are numpy's linear interpolation.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpushepherd.sim.engine import SimResult
from gpushepherd.tails import slowdown, tail_figures

COLUMNS = ["job_id", "user", "team", "class", "gpus", "submit", "start", "end", "duration", "state",
           "preemptions", "runs", "nodes", "queueing_delay", "jct", "deadline", "deadline_at_risk"]
ENDED = ("COMPLETED", "FAILED", "TIMEOUT")


def job_table(result: SimResult) -> pd.DataFrame:
    """One row per job, in trace order, with the columns of ``COLUMNS`` (seconds)."""
    rows = []
    core_jobs = getattr(result.scheduler, "jobs", {})  # a baseline not on the core flags nothing
    for rec in result.records.values():
        spec = rec.spec
        start = rec.first_start
        end = rec.end if rec.state in ENDED else None
        last = rec.starts[-1][1].nodes if rec.starts else ()
        rows.append((
            spec.id, spec.user, spec.team, spec.workload_class, spec.gpus, spec.submit_time,
            start, end, rec.duration, rec.state, len(rec.preempted_at), len(rec.starts), "+".join(last),
            None if start is None else start - spec.submit_time,
            None if end is None else end - spec.submit_time,
            spec.deadline, bool(getattr(core_jobs.get(spec.id), "deadline_flags", None)),
        ))
    df = pd.DataFrame.from_records(rows, columns=COLUMNS)
    for col in ("start", "end", "duration", "queueing_delay", "jct", "deadline"):
        df[col] = df[col].astype("float64")
    return df


def _stats(values: np.ndarray) -> dict[str, float | None]:
    if values.size == 0:
        return {"mean": None, "p50": None, "p95": None, "p99": None}
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return {"mean": float(values.mean()), "p50": float(p50), "p95": float(p95), "p99": float(p99)}


def _group(df: pd.DataFrame) -> dict[str, Any]:
    ended = df[df["state"].isin(ENDED)]
    started = df[df["start"].notna()]
    return {
        "jobs": int(len(df)),
        "finished": int(len(ended)),
        "rejected": int((df["state"] == "REJECTED").sum()),
        "unfinished": int(len(df) - len(ended) - (df["state"] == "REJECTED").sum()),
        "jct_s": _stats(ended["jct"].to_numpy(dtype=float)),
        "queueing_delay_s": _stats(started["queueing_delay"].to_numpy(dtype=float)),
        "mean_duration_s": float(ended["duration"].mean()) if len(ended) else None,
        "gpu_seconds": float((ended["duration"] * ended["gpus"]).sum()),
        "preemptions": int(df["preemptions"].sum()),
    }


def tails(df: pd.DataFrame) -> dict[str, Any]:
    """``gpushepherd.tails.tail_figures`` of a ``job_table``: wait per size class over
    the jobs that started, slowdown (JCT over the true duration) over those that ended."""
    slow = [float("nan") if math.isnan(j) else slowdown(j, d) for j, d in zip(df["jct"], df["duration"])]
    return tail_figures(df["gpus"].tolist(), df["queueing_delay"].tolist(), slow, df["user"].tolist())


def deadlines(df: pd.DataFrame) -> dict[str, Any]:
    """Deadlines met, missed and flagged of a ``job_table`` (module docstring)."""
    d = df[df["deadline"].notna()]
    ended = d["state"].isin(ENDED)
    met = ended & (d["end"] <= d["deadline"])
    flagged = d["deadline_at_risk"].astype(bool)
    n = int(len(d))
    return {"jobs": n, "met": int(met.sum()), "missed": int((ended & ~met).sum()), "not_ended": int((~ended).sum()),
            "met_share": float(met.sum()) / n if n else None, "flagged": int(flagged.sum()),
            "flagged_met": int((flagged & met).sum())}


def summarize(result: SimResult, df: pd.DataFrame | None = None) -> dict[str, Any]:
    """Overall, per-class and per-team figures of a run, and its ``tails`` (see the
    module docstring)."""
    if df is None:
        df = job_table(result)
    overall = _group(df)
    span = result.t_last - result.t_first
    overall["utilisation"] = result.busy_gpu_s / result.capacity_gpu_s if result.capacity_gpu_s > 0 else 0.0
    overall["makespan_s"] = span
    overall["lower_bound_jct_s"] = overall["mean_duration_s"]
    mean_jct = overall["jct_s"]["mean"]
    lb = overall["mean_duration_s"]
    overall["jct_over_lower_bound"] = mean_jct / lb if mean_jct is not None and lb else None
    return {
        "overall": overall,
        "by_class": {k: _group(g) for k, g in sorted(df.groupby("class"), key=lambda kv: kv[0])},
        "by_team": {k: _group(g) for k, g in sorted(df.groupby("team"), key=lambda kv: kv[0])},
        **tails(df),
        "deadlines": deadlines(df),
    }


#: how many reasons ``not_run`` lists per outcome
TOP_REASONS = 3
#: the pending reason ``not_run`` gives under a scheduler that explains nothing
NO_REASON = "no reason given (a baseline not on gpushepherd's core gives none)"


def not_run(result: SimResult, top: int = TOP_REASONS) -> dict[str, Any]:
    """Jobs that never ran and why (module docstring): ``{"rejected": n,
    "rejected_reasons": [[reason, jobs], ...], "never_started": n,
    "pending_reasons": [[reason, jobs], ...]}``, at most ``top`` reasons each. A
    scheduler without ``pending_reason`` (a baseline not on the core) gives the reason
    ``NO_REASON``."""
    rejected: dict[str, int] = {}
    pending: dict[str, int] = {}
    reason_of = getattr(result.scheduler, "pending_reason", None)
    for job_id, rec in result.records.items():
        if rec.state == "REJECTED":
            why = rec.rejected or "unknown"
            rejected[why] = rejected.get(why, 0) + 1
        elif rec.state == "PENDING" and not rec.starts:
            why = NO_REASON
            if reason_of is not None:
                found = reason_of(job_id)  # None: never submitted (a replay interrupted first)
                why = "not submitted yet" if found is None else str(found)
            pending[why] = pending.get(why, 0) + 1

    def ranked(counts: dict[str, int]) -> list[list]:
        return [[k, v] for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]]

    return {"rejected": sum(rejected.values()), "rejected_reasons": ranked(rejected),
            "never_started": sum(pending.values()), "pending_reasons": ranked(pending)}


def write_jobs(df: pd.DataFrame, path: str | Path, like: str | Path | None = None) -> None:
    """Write the per-job table as CSV (``.csv``, ``.csv.gz``) or Parquet (``.parquet``),
    by the suffix of ``like`` (default: of ``path``).

    Raises:
        ValueError: any other suffix.
    """
    path = Path(path)
    name = Path(like or path).name.lower()
    if name.endswith(".parquet"):
        df.to_parquet(path, index=False)
    elif name.endswith(".csv"):
        df.to_csv(path, index=False, lineterminator="\n")
    elif name.endswith(".csv.gz"):  # mtime 0: the same run gives the same bytes
        df.to_csv(path, index=False, lineterminator="\n", compression={"method": "gzip", "mtime": 0})
    else:
        raise ValueError(f"--out: {str(path)!r} is not allowed: a .csv, .csv.gz or .parquet file")


def stranded_summary(result: SimResult) -> dict[str, Any]:
    """Free and stranded GPU capacity over the samples of ``result.stranded``
    (``Simulator(stranded_every_s=...)``): sample count, mean free and stranded GPUs,
    the most stranded at once, and the mean stranded GPUs per constraint
    (``gpushepherd.core.stranded``). Means are over samples, not time-weighted."""
    rows = result.stranded
    n = len(rows)
    if not n:
        return {"samples": 0, "mean_free_gpus": 0.0, "mean_stranded_gpus": 0.0, "max_stranded_gpus": 0.0,
                "mean_by_constraint": {}}
    by: dict[str, float] = {}
    for _t, _free, _stranded, parts in rows:
        for k, v in parts.items():
            by[k] = by.get(k, 0.0) + v
    return {"samples": n, "mean_free_gpus": sum(r[1] for r in rows) / n,
            "mean_stranded_gpus": sum(r[2] for r in rows) / n, "max_stranded_gpus": max(r[2] for r in rows),
            "mean_by_constraint": {k: v / n for k, v in sorted(by.items())}}

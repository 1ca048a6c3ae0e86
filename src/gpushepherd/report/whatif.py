"""What-if on a store's own history (R19, note 010): the jobs the log recorded, replayed
through the simulator under the policy they ran under and under a proposed one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gpushepherd.core.scheduler import SpecError, validate_spec
from gpushepherd.model.events import Event, JobCancelled
from gpushepherd.model.rules import Rules
from gpushepherd.report.history import History, Replay
from gpushepherd.sim.engine import SimJob, SimProgress, SimResult, Simulator

H = 3600.0
RAN = ("COMPLETED", "FAILED", "TIMEOUT")


def workload(rp: Replay, t_from: float, t_to: float) -> tuple[list[SimJob], list[Event]]:
    """The jobs submitted in ``[t_from, t_to)`` with their true run time, and the cancels
    to replay (note 010): a job that ran to its end (completed, failed, stopped) runs
    as long as it did - all its runs if it checkpoints, else its last run; a cancelled
    job is cancelled at the same time after its submit; a job not ended by the last
    event, or rejected, is cancelled at ``t_to``, or at the last event if that is earlier
    (censored: the log knows nothing later; review issue 9b)."""
    hist = rp.history()
    rec = rp.recorder
    runs = {job_id: g for job_id, g in hist.held.groupby("job_id")}
    jobs: list[SimJob] = []
    events: list[Event] = []
    sel = hist.jobs[(hist.jobs["submit"] >= t_from) & (hist.jobs["submit"] < t_to)]
    for row in sel.itertuples(index=False):
        spec = rec.specs[row.job_id]
        g = runs.get(row.job_id)
        lengths = [] if g is None else list((g["end"] - g["start"]).to_numpy(dtype=float))
        duration = None
        if row.state in RAN and lengths:
            duration = float(sum(lengths)) if rec.checkpointable[row.job_id] else float(lengths[-1])
        elif row.state == "CANCELLED" and not np.isnan(row.end):
            events.append(JobCancelled(row.end, row.job_id))
        else:
            events.append(JobCancelled(max(min(t_to, rp.t_last), spec.submit_time), row.job_id))
        jobs.append(SimJob(spec, duration))
    return jobs, events


def split_workload(rules: Rules, jobs: list[SimJob], source: str) -> tuple[list[SimJob], list[tuple[str, str]]]:
    """The jobs ``rules`` can take, and ``(job id, why not)`` for the others ("class X
    not in the proposed policy", "team X ...", or the spec error), review issue 10b.

    Raises:
        SpecError: naming the policy file, when no job of the history can be taken.
    """
    keep, left_out = [], []
    for sj in jobs:
        spec = sj.spec
        if spec.workload_class not in rules.classes:
            left_out.append((spec.id, f"class {spec.workload_class} not in the proposed policy"))
        elif rules.teams and spec.team not in rules.teams:
            left_out.append((spec.id, f"team {spec.team} not in the proposed policy"))
        else:
            try:
                validate_spec(rules, spec)
                keep.append(sj)
            except SpecError as exc:
                left_out.append((spec.id, str(exc)))
    if not keep:
        counts: dict[str, int] = {}
        for _j, w in left_out:
            counts[w] = counts.get(w, 0) + 1
        why = "; ".join(f"{w} ({n} job{'s' if n > 1 else ''})" for w, n in sorted(counts.items()))
        raise SpecError(f"{source}: no job of the history can run under this policy, nothing to compare: {why}")
    return keep, left_out


REJECTED_COLUMNS = ["run", "job_id", "class", "team", "gpus", "reason"]


@dataclass
class WhatIf:
    """Both runs and their side-by-side figures (``table``: one row per class and team).

    ``rejected``: ``REJECTED_COLUMNS``, one row per job a run rejected (it could never
    run under that policy; ``run`` is ``current`` or ``proposed``, ``reason`` the core's)."""

    current: SimResult
    proposed: SimResult
    table: pd.DataFrame
    t_from: float
    t_to: float
    rejected: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=REJECTED_COLUMNS))
    #: ``(job id, why)`` of the range's jobs the proposed policy cannot take, left out of both runs
    not_replayed: list[tuple[str, str]] = field(default_factory=list)

    def history(self, which: str) -> History:
        return History.from_sim(self.current if which == "current" else self.proposed)


def run_whatif(rp: Replay, proposed: Rules, t_from: float, t_to: float, source: str = "--policy",
               record_reasons: bool = False,
               progress: Callable[[str, int], Callable[[SimProgress], None]] | None = None) -> WhatIf:
    """Simulate the range's workload under the log's last policy and ``proposed``.
    ``progress(label, jobs)``, if given, returns the ``on_progress`` callback of each
    run (``gpushepherd.cli.main.SimBar.replay``).

    Jobs the proposed policy cannot take (its class or team removed, ...) are left out
    of both runs and listed in ``WhatIf.not_replayed``.

    Raises:
        SpecError: no job of the range can be taken by the proposed policy.
        ValueError: no job was submitted in the range.
    """
    jobs, events = workload(rp, t_from, t_to)
    if not jobs:
        raise ValueError("no job was submitted in the range: nothing to replay (widen --since or --from/--to)")
    jobs, not_replayed = split_workload(proposed, jobs, source)
    kept = {sj.spec.id for sj in jobs}
    events = [e for e in events if e.job_id in kept]
    runs = [Simulator(rules, jobs, events, record_reasons=record_reasons,
                      on_progress=progress(f"{which} policy", len(jobs)) if progress else None).run()
            for which, rules in (("current", rp.rules), ("proposed", proposed))]
    frames = [_figures(r) for r in runs]
    table = _side_by_side(*frames)
    rejected = [(which, job_id, r.spec.workload_class, r.spec.team, r.spec.gpus,
                 str(res.scheduler.jobs[job_id].reason.detail or res.scheduler.jobs[job_id].reason))
                for which, res in zip(("current", "proposed"), runs)
                for job_id, r in sorted(res.records.items()) if r.state == "REJECTED"]
    return WhatIf(runs[0], runs[1], table, t_from, t_to, pd.DataFrame(rejected, columns=REJECTED_COLUMNS),
                  not_replayed)


def _figures(res: SimResult) -> pd.DataFrame:
    """Per class and per team: jobs, jobs rejected (never ran), wait mean / p95 (s),
    mean JCT (s), GPU-hours."""
    hist = History.from_sim(res)
    jobs = hist.jobs.copy()
    jobs["wait"] = jobs["first_start"] - jobs["submit"]
    jobs["jct"] = np.where(jobs["state"].isin(RAN), jobs["end"] - jobs["submit"], np.nan)
    held = hist.held.copy()
    held["gpu_hours"] = (held["end"].fillna(hist.t_last) - held["start"]) * held["gpus"] / H
    rows = []
    for kind, key in (("class", "class"), ("team", "team")):
        hours = held.groupby(key)["gpu_hours"].sum()
        for name, g in sorted(jobs.groupby(key), key=lambda kv: kv[0]):
            w = g["wait"].dropna().to_numpy(dtype=float)
            j = g["jct"].dropna().to_numpy(dtype=float)
            rows.append((kind, name, len(g), int((g["state"] == "REJECTED").sum()), float(w.mean()) if w.size else None,
                         float(np.percentile(w, 95)) if w.size else None, float(j.mean()) if j.size else None,
                         float(hours.get(name, 0.0))))
    return pd.DataFrame(rows, columns=["by", "group", "jobs", "rejected", "wait_mean_s", "wait_p95_s", "jct_mean_s", "gpu_hours"])


def _side_by_side(cur: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    df = cur.merge(new, on=["by", "group", "jobs"], suffixes=("_current", "_proposed"), how="outer")
    for col in ("wait_mean_s", "wait_p95_s", "jct_mean_s", "gpu_hours"):
        df[f"{col}_change"] = df[f"{col}_proposed"] - df[f"{col}_current"]
    order = ["by", "group", "jobs", "rejected_current", "rejected_proposed"] + [f"{c}_{s}" for c in ("wait_mean_s", "wait_p95_s", "jct_mean_s", "gpu_hours")
                                       for s in ("current", "proposed", "change")]
    return df[order].sort_values(["by", "group"]).reset_index(drop=True)

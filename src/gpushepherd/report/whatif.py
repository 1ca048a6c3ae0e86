"""What-if on a store's own history (R19, note 010): the jobs the log recorded, replayed
through the simulator under the policy they ran under and under a proposed one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from gpushepherd.core.scheduler import SpecError, validate_spec
from gpushepherd.model.events import Event, JobCancelled, JobUpdated
from gpushepherd.model.rules import Rules
from gpushepherd.report.history import History, Replay
from gpushepherd.sim.engine import SignalAnswer, SimJob, SimProgress, SimResult, Simulator

H = 3600.0
INF = float("inf")
RAN = ("COMPLETED", "FAILED", "TIMEOUT")


def workload(rp: Replay, t_from: float, t_to: float) -> tuple[list[SimJob], list[Event]]:
    """The jobs submitted in ``[t_from, t_to)`` with their true run time, and the cancels
    to replay (note 010): a job that ran to its end (completed, failed, stopped) runs
    as long as it did - if it checkpoints, its last run plus the work its earlier runs
    kept (``victim_answers``), else its last run; a cancelled job is cancelled at the
    same time after its submit; a job not ended by the last event, or rejected, is
    cancelled at ``t_to``, or at the last event if that is earlier (censored: the log
    knows nothing later; review issue 9b). Each job answers preemption signals as its
    victims' exits in the log did (note 026); its updates (time limit, nice; note 039)
    come at the times they were made, on the spec it was submitted with."""
    hist = rp.history()
    rec = rp.recorder
    runs = {job_id: g for job_id, g in hist.held.groupby("job_id")}
    jobs: list[SimJob] = []
    events: list[Event] = []
    sel = hist.jobs[(hist.jobs["submit"] >= t_from) & (hist.jobs["submit"] < t_to)]
    for row in sel.itertuples(index=False):
        spec = rec.specs[row.job_id]
        g = runs.get(row.job_id)
        spans = [] if g is None else list(zip(g["start"].to_numpy(dtype=float), g["end"].to_numpy(dtype=float)))
        last = float(spans[-1][1] - spans[-1][0]) if row.state in RAN and spans else None
        answers, kept = victim_answers(spans, rec.signals.get(row.job_id, []), rec.victim_exits.get(row.job_id, []),
                                       last)
        duration = None
        if last is not None:
            duration = kept + last if rec.checkpointable[row.job_id] else last
        elif row.state == "CANCELLED" and not np.isnan(row.end):
            events.append(JobCancelled(row.end, row.job_id))
        else:
            events.append(JobCancelled(max(min(t_to, rp.t_last), spec.submit_time), row.job_id))
        jobs.append(SimJob(spec, duration, signal_answers=answers))
    chosen = set(sel["job_id"])
    events.extend(e for e in rec.updates if e.job_id in chosen)  # scontrol update (note 039), as logged
    return jobs, events


def updates_under(rules: Rules, jobs: list[SimJob], events: list[Event]) -> list[Event]:
    """``events`` with each logged update of one of ``jobs`` (``JobUpdated``, note 039) as
    ``rules`` can take it: made by an admin (it was allowed when made) and its time limit
    at most the job's class's max runtime under ``rules``; the other events unchanged."""
    classes = {sj.spec.id: rules.classes[sj.spec.workload_class] for sj in jobs}
    out: list[Event] = []
    for e in events:
        if isinstance(e, JobUpdated):
            cap = classes[e.job_id].max_runtime_s
            limit = e.time_limit_s if e.time_limit_s is None or cap is None else min(e.time_limit_s, cap)
            e = replace(e, admin=True, time_limit_s=limit)
        out.append(e)
    return out


def victim_answers(spans: list[tuple[float, float]], signals: list[tuple[float, float]],
                   exits: list[tuple[float, str]], last_s: float | None) -> tuple[tuple[SignalAnswer, ...], float]:
    """How a job answered each preemption signal the log shows, and the seconds of work
    its runs before the last one kept (note 026).

    Args:
        spans: its runs, ``(start, end)`` in order (``end`` NaN: still running).
        signals: its ``Preempt`` signals, ``(t, grace period s)`` (``Recorder.signals``).
        exits: its exits while preempted, ``(t, ExitStatus value)`` (``Recorder.victim_exits``).
        last_s: the length of its last run when it ran to its end, else ``None``.

    A run signalled at ``p`` with grace ``g`` that ended at ``e`` answers with an exit
    ``e - p`` after the signal - a save if it exited ``PREEMPTED`` (exit 85) - or, past
    ``g``, with a kill ``e - p - g`` late (the daemon's loop step); one that completed
    inside its grace is a victim not killed before it completes. The work a run kept is
    what the simulator keeps for the same answer: the run up to the signal after a save,
    the whole run after an operator's requeue; after a kill or a death, its last
    checkpoint, which the log does not show: the run up to the signal, but at least
    enough that the job could not have completed in that run (the runs after it needed
    only ``r`` more seconds, so it kept more than its length minus ``r``: half of ``r``
    is the margin) and at most the run. So the baseline's runs last as long as the log's.
    """
    answers: list[SignalAnswer] = []
    ended = {t: status for t, status in exits}
    runs: list[tuple[float, float, tuple[float, float] | None]] = []  # (start, end, signal)
    for a, b in spans:
        sig = next(((p, g) for p, g in signals if a <= p and (np.isnan(b) or p <= b)), None)
        runs.append((a, b, sig))
        if sig is None or np.isnan(b):
            continue  # not preempted, or still inside its grace period at the end of the log
        p, g = sig
        d, status = float(b - p), ended.get(b)
        if status == "COMPLETED":  # it finished inside its grace period: no kill came before
            answers.append(SignalAnswer(None, False, late_s=max(0.0, d - g)))
        else:
            answers.append(SignalAnswer(d if d <= g else None, status == "PREEMPTED", late_s=max(0.0, d - g)))
    kept, after = 0.0, INF if last_s is None else last_s  # after: work the later runs needed
    k = len(answers)
    for a, b, sig in reversed(runs[:-1]):
        if sig is None:
            run_kept = float(b - a)
        else:
            k -= 1
            p, g = sig
            if answers[k].outcome(g)[1]:
                run_kept = float(p - a)
            else:
                run_kept = float(p - a) if after == INF else min(float(b - a), max(float(p - a),
                                                                                     float(b - a) - after / 2))
                answers[k] = replace(answers[k], kept_s=run_kept)
        kept += run_kept
        after += run_kept
    return tuple(answers), kept


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
#: the figures of each group, in the table's order (seconds, seconds, seconds, GPU-hours)
METRICS = ("wait_mean_s", "wait_p95_s", "jct_mean_s", "gpu_hours")
#: the three columns of each figure: what the log shows, the baseline (the log's jobs
#: simulated under the policy they ran under) and the proposed policy, simulated (note 040)
RUNS = ("measured", "current", "proposed")


@dataclass
class WhatIf:
    """Both runs and their side-by-side figures (``table``: one row per class and team;
    per figure of ``METRICS`` its ``_measured`` value (the log), ``_current`` (the
    baseline), ``_proposed`` and ``_change`` (proposed - current); ``rejected_`` per run).

    ``rejected``: ``REJECTED_COLUMNS``, one row per job a run rejected (it could never
    run under that policy; ``run`` is ``current`` or ``proposed``, ``reason`` the core's).
    ``measured``: the log's history of the compared jobs (the same jobs as both runs),
    its runs still going at the end of the log censored at ``min(t_to, last event)``."""

    current: SimResult
    proposed: SimResult
    table: pd.DataFrame
    t_from: float
    t_to: float
    rejected: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=REJECTED_COLUMNS))
    #: ``(job id, why)`` of the range's jobs the proposed policy cannot take, left out of both runs
    not_replayed: list[tuple[str, str]] = field(default_factory=list)
    measured: History | None = None

    def history(self, which: str) -> History:
        """The history of ``which`` run: ``measured`` (the log), ``current`` or ``proposed``."""
        if which == "measured":
            return self.measured
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
    runs = [Simulator(rules, jobs, updates_under(rules, jobs, events), record_reasons=record_reasons,
                      on_progress=progress(f"{which} policy", len(jobs)) if progress else None).run()
            for which, rules in (("current", rp.rules), ("proposed", proposed))]
    measured = _measured(rp.history(), kept, min(t_to, rp.t_last))
    table = _side_by_side([_figures(measured)] + [_figures(History.from_sim(r)) for r in runs])
    rejected = [(which, job_id, r.spec.workload_class, r.spec.team, r.spec.gpus,
                 str(res.scheduler.jobs[job_id].reason.detail or res.scheduler.jobs[job_id].reason))
                for which, res in zip(("current", "proposed"), runs)
                for job_id, r in sorted(res.records.items()) if r.state == "REJECTED"]
    return WhatIf(runs[0], runs[1], table, t_from, t_to, pd.DataFrame(rejected, columns=REJECTED_COLUMNS),
                  not_replayed, measured)


def _measured(hist: History, job_ids: set[str], censor: float) -> History:
    """``hist`` (the log's) cut to ``job_ids``, a run still going at its end ending at
    ``censor`` (the simulated runs cancel such a job there: ``workload``)."""
    cut = {name: getattr(hist, name)[getattr(hist, name)["job_id"].isin(job_ids)].reset_index(drop=True)
           for name in ("jobs", "held", "pending", "reasons", "idle")}
    held = cut["held"]
    if held["end"].isna().any():
        held["end"] = held["end"].fillna(held["start"].clip(lower=censor))
    return replace(hist, **cut)


def _figures(hist: History) -> pd.DataFrame:
    """Per class and per team: jobs, jobs rejected (never ran), wait mean / p95 (s),
    mean JCT (s), GPU-hours."""
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


def _side_by_side(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """``frames`` of ``RUNS`` (``_figures``) in one table: per figure the three runs
    and the change proposed - current."""
    df = None
    for run, f in zip(RUNS, frames):
        f = f.rename(columns={c: f"{c}_{run}" for c in f.columns if c not in ("by", "group", "jobs")})
        df = f if df is None else df.merge(f, on=["by", "group", "jobs"], how="outer")
    for col in METRICS:
        df[f"{col}_change"] = df[f"{col}_proposed"] - df[f"{col}_current"]
    order = ["by", "group", "jobs"] + [f"rejected_{r}" for r in RUNS] + [
        f"{c}_{s}" for c in METRICS for s in (*RUNS, "change")]
    return df[order].sort_values(["by", "group"]).reset_index(drop=True)

"""What happened, as tables: the one data shape the report reads (note 010).

A ``History`` is built from a replay of the daemon's event log (``replay``,
``History.from_store``) or from a simulator run (``History.from_sim``). Times are
seconds on the scheduler's axis (epoch seconds for the daemon); GPUs are quota units /
7000 (a MIG ``1g.10gb`` counts 1/7, ``fraction:0.5`` 0.5: what the core charges).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd

from gpushepherd.core.scheduler import Scheduler
from gpushepherd.core.state import Transition
from gpushepherd.model.decisions import Preempt, Start
from gpushepherd.model.events import JobFinished, JobSubmitted, JobUpdated, UsageSample
from gpushepherd.model.job import JobSpec, JobState
from gpushepherd.model.placement import Placement
from gpushepherd.model.rules import Rules
from gpushepherd.policy.load import policy_from_dict

HOLDING = ("RUNNING", "PREEMPTING", "STOPPING")
#: utilisation below which a sample counts as idle for a class without ``idle_stop`` (percent)
IDLE_UTIL_PCT = 5.0

JOB_COLUMNS = ["job_id", "team", "user", "class", "gpus", "submit", "first_start", "end", "state", "runs"]
HELD_COLUMNS = ["job_id", "team", "user", "class", "project", "gpu_type", "gpus", "start", "end"]
SPAN_COLUMNS = ["job_id", "team", "class", "start", "end"]
REASON_COLUMNS = ["job_id", "team", "class", "start", "end", "reason"]
IDLE_COLUMNS = ["job_id", "team", "class", "gpus", "start", "end"]


class HistoryError(ValueError):
    """A log or run the report cannot use (an empty store, ...); ``str()`` says why."""


@dataclass
class History:
    """Tables of one history. Frames (times in seconds, ``end`` NaN: still going at
    ``t_last``):

    * ``jobs``: ``JOB_COLUMNS``, one row per job (``gpus`` in GPUs, pro rata);
    * ``held``: ``HELD_COLUMNS``, one row per run holding GPUs (grace periods
      included), ``gpu_type`` of the run's first node;
    * ``pending``: ``SPAN_COLUMNS``, intervals a job was PENDING;
    * ``reasons``: ``REASON_COLUMNS``, intervals a pending job had one reason;
    * ``idle``: ``IDLE_COLUMNS``, intervals a run was idle by its usage samples.

    ``capacity``: GPUs per GPU type; ``t_first`` / ``t_last``: first and last event;
    ``rules``: the policy in force at the end (quotas, prices, classes).
    """

    jobs: pd.DataFrame
    held: pd.DataFrame
    pending: pd.DataFrame
    reasons: pd.DataFrame
    idle: pd.DataFrame
    capacity: dict[str, int]
    t_first: float
    t_last: float
    rules: Rules

    @property
    def total_gpus(self) -> int:
        return sum(self.capacity.values())

    @classmethod
    def from_store(cls, store) -> "History":
        """Replay ``store``'s event log (``gpushepherd.daemon.store.Store``; read only,
        the server lock is not taken). Raises ``HistoryError`` on an empty log."""
        return replay(store.batches()).history()

    @classmethod
    def from_sim(cls, result, samples: Iterable[UsageSample] = ()) -> "History":
        """A simulator run (``SimResult``; run it with ``record_reasons=True`` for the
        reasons table). ``samples``: the usage samples it was given, if any."""
        sched = result.scheduler
        rec = Recorder()
        for job_id, r in result.records.items():
            rec.placements[job_id] = [p for _t, p in r.starts]
            rec.reason_rows.extend((job_id, a, b, why) for a, b, why in r.reasons)
        rec.samples = [s for s in samples if isinstance(s, UsageSample)]
        rec.harvest(sched)
        return rec.build(sched.rules, result.t_first, result.t_last)


@dataclass
class Recorder:
    """Collects what a replay shows: transitions (kept across a policy change, whose
    ``restore`` starts histories afresh), placements, pending reasons, samples."""

    transitions: dict[str, list[Transition]] = field(default_factory=dict)
    specs: dict[str, JobSpec] = field(default_factory=dict)
    fraction: dict[str, float] = field(default_factory=dict)
    checkpointable: dict[str, bool] = field(default_factory=dict)
    placements: dict[str, list[Placement]] = field(default_factory=dict)
    reason_rows: list[tuple[str, float, float | None, str]] = field(default_factory=list)
    samples: list[UsageSample] = field(default_factory=list)
    node_types: dict[str, str] = field(default_factory=dict)
    cursor: dict[str, int] = field(default_factory=dict)
    open_reasons: dict[str, tuple[float, str]] = field(default_factory=dict)
    #: per job, its preemption signals: ``(t, grace period in s)`` (``Preempt`` decisions)
    signals: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    #: per job, the exits of its runs while it was being preempted: ``(t, ExitStatus
    #: value)`` as logged (``PREEMPTED``: it saved and asked to be requeued, exit 85;
    #: ``FAILED``: killed at the end of its grace period, or died on the signal)
    victim_exits: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    #: the log's changes of jobs after submit (time limit, nice; note 039), in order
    updates: list[JobUpdated] = field(default_factory=list)

    def harvest(self, sched: Scheduler) -> None:
        """Take the transitions added since the last harvest."""
        for n in sched.rules.nodes:
            self.node_types.setdefault(n.name, n.gpu_type)
        for job_id, job in sched.jobs.items():
            self.specs.setdefault(job_id, job.spec)  # as submitted (``replay``), before any update
            self.fraction[job_id] = job.fraction
            self.checkpointable[job_id] = job.checkpointable
            seen = self.cursor.get(job_id, 0)
            if len(job.history) > seen:
                self.transitions.setdefault(job_id, []).extend(job.history[seen:])
            self.cursor[job_id] = len(job.history)

    def note(self, states: dict[str, JobState], exits: list[JobFinished], decisions: list) -> None:
        """Keep what the what-if needs of victims (note 026): the status of each exit
        (``exits``) of a job that was being preempted (``states``: the jobs' states
        before the batch) and each ``Preempt`` among the batch's ``decisions``."""
        for e in exits:
            if states.get(e.job_id) is JobState.PREEMPTING:
                self.victim_exits.setdefault(e.job_id, []).append((e.t, e.status.value))
        for d in decisions:
            if isinstance(d, Preempt):
                self.signals.setdefault(d.job_id, []).append((d.t, d.grace_s))

    def restored(self, sched: Scheduler) -> None:
        """After ``Scheduler.restore``: its "restored" lines are not news."""
        self.cursor = {job_id: len(job.history) for job_id, job in sched.jobs.items()}

    def sample_reasons(self, sched: Scheduler, t: float) -> None:
        """Every pending job's reason now, held until it changes or the job leaves PENDING."""
        pending = {j.id for j in sched.pending_jobs()}
        for job_id in sorted(set(self.open_reasons) - pending):
            start, why = self.open_reasons.pop(job_id)
            self.reason_rows.append((job_id, start, t, why))
        for job_id in sorted(pending):
            why = str(sched.pending_reason(job_id))
            cur = self.open_reasons.get(job_id)
            if cur is not None and cur[1] == why:
                continue
            if cur is not None:
                self.reason_rows.append((job_id, cur[0], t, cur[1]))
            self.open_reasons[job_id] = (t, why)

    def close_reasons(self) -> None:
        for job_id in sorted(self.open_reasons):
            start, why = self.open_reasons[job_id]
            self.reason_rows.append((job_id, start, None, why))
        self.open_reasons = {}

    def build(self, rules: Rules, t_first: float, t_last: float) -> History:
        job_rows, held_rows, pend_rows, runs_of = [], [], [], {}
        for job_id in sorted(self.specs, key=lambda j: (self.specs[j].submit_time, j)):
            spec, frac = self.specs[job_id], self.fraction[job_id]
            places = self.placements.get(job_id, [])
            runs: list[tuple[float, float | None]] = []
            pend_from: float | None = None
            run_from: float | None = None
            state, end = "PENDING", None
            for tr in self.transitions.get(job_id, []):
                if tr.to_state == tr.from_state:
                    continue
                if tr.to_state == "PENDING":
                    pend_from = tr.t
                elif tr.from_state == "PENDING" and pend_from is not None:
                    pend_rows.append((job_id, spec.team, spec.workload_class, pend_from, tr.t))
                    pend_from = None
                holds, held_before = tr.to_state in HOLDING, tr.from_state in HOLDING
                if holds and not held_before:
                    run_from = tr.t
                elif held_before and not holds and run_from is not None:
                    runs.append((run_from, tr.t))
                    run_from = None
                state = tr.to_state
                if tr.to_state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "REJECTED"):
                    end = tr.t
            if pend_from is not None:
                pend_rows.append((job_id, spec.team, spec.workload_class, pend_from, None))
            if run_from is not None:
                runs.append((run_from, None))
            runs_of[job_id] = runs
            for i, (a, b) in enumerate(runs):
                place = places[i] if i < len(places) else (places[-1] if places else None)
                gpu_type = self.node_types.get(place.nodes[0], "generic") if place is not None else "generic"
                held_rows.append((job_id, spec.team, spec.user, spec.workload_class, spec.project or "-", gpu_type,
                                  frac, a, b))
            job_rows.append((job_id, spec.team, spec.user, spec.workload_class, frac, spec.submit_time,
                             runs[0][0] if runs else None, end, state, len(runs)))
        specs = self.specs
        reasons = [(j, specs[j].team, specs[j].workload_class, a, b, why) for j, a, b, why in self.reason_rows
                   if j in specs and (b is None or b > a)]
        capacity: dict[str, int] = {}
        for n in rules.nodes:
            capacity[n.gpu_type] = capacity.get(n.gpu_type, 0) + n.gpus
        return History(
            jobs=_frame(job_rows, JOB_COLUMNS, ("gpus", "submit", "first_start", "end")),
            held=_frame(held_rows, HELD_COLUMNS, ("gpus", "start", "end")),
            pending=_frame(pend_rows, SPAN_COLUMNS, ("start", "end")),
            reasons=_frame(sorted(reasons, key=lambda r: (r[3], r[0])), REASON_COLUMNS, ("start", "end")),
            idle=_frame(self._idle_rows(rules, runs_of), IDLE_COLUMNS, ("gpus", "start", "end")),
            capacity=capacity, t_first=t_first, t_last=t_last, rules=rules)

    def _idle_rows(self, rules: Rules, runs_of: dict[str, list]) -> list[tuple]:
        """A sample speaks for the time since the run's previous sample (or its start,
        note 009); below the class's idle threshold that time is idle."""
        rows = []
        last: dict[str, float] = {}
        for s in sorted(self.samples, key=lambda s: (s.t, s.job_id)):
            spec = self.specs.get(s.job_id)
            if spec is None:
                continue
            run = next((r for r in runs_of.get(s.job_id, ()) if r[0] <= s.t and (r[1] is None or s.t <= r[1])), None)
            if run is None:
                continue
            since = max(run[0], last.get(s.job_id, run[0]))
            last[s.job_id] = s.t
            cls = rules.classes.get(spec.workload_class)
            threshold = cls.idle_stop.below_util_pct if cls is not None and cls.idle_stop else IDLE_UTIL_PCT
            if s.gpu_util_pct < threshold and s.t > since:
                rows.append((s.job_id, spec.team, spec.workload_class, self.fraction[s.job_id], since, s.t))
        return rows


def _frame(rows: list[tuple], columns: list[str], floats: tuple[str, ...]) -> pd.DataFrame:
    df = pd.DataFrame.from_records(rows, columns=columns)
    for col in floats:
        df[col] = df[col].astype("float64")
    return df


@dataclass
class Replay:
    """The end of a replay of an event log: the scheduler, what it showed, the policies."""

    sched: Scheduler
    recorder: Recorder
    policies: list[dict]
    t_first: float
    t_last: float

    @property
    def rules(self) -> Rules:
        return self.sched.rules

    def history(self) -> History:
        return self.recorder.build(self.sched.rules, self.t_first, self.t_last)


def replay(batches: Iterable[tuple[float, str, object]]) -> Replay:
    """Replay an event log given as ``Store.batches()`` items (``(t, "policy", raw)``
    or ``(t, "events", [Event, ...])``) as the daemon does at start (note 008),
    sampling pending reasons after each batch.

    Raises:
        HistoryError: no policy or no event in the log.
        PolicyError: a logged policy the code no longer accepts.
    """
    sched: Scheduler | None = None
    rec = Recorder()
    policies: list[dict] = []
    t_first = t_last = None
    for t, kind, item in batches:
        if kind == "policy":
            policies.append(item)
            rules = policy_from_dict(item, source="policy in the event log", intake=False).rules
            if sched is None:
                sched = Scheduler(rules)
            else:  # the server restarted under another policy: same state, new rules
                rec.harvest(sched)
                sched = Scheduler.restore(rules, json.loads(json.dumps(sched.snapshot())), new_rules=True)
                rec.restored(sched)
            continue
        if sched is None:
            raise HistoryError("the event log has events before any policy: not a gpushepherd log")
        events = list(item)
        rec.samples.extend(e for e in events if isinstance(e, UsageSample))
        rec.updates.extend(e for e in events if isinstance(e, JobUpdated))
        for e in events:
            if isinstance(e, JobSubmitted) and e.spec is not None:
                rec.specs.setdefault(e.spec.id, e.spec)
        exits = [e for e in events if isinstance(e, JobFinished)]
        states = {e.job_id: sched.jobs[e.job_id].state for e in exits if e.job_id in sched.jobs}
        decisions = sched.handle(events)
        for d in decisions:
            if isinstance(d, Start):
                rec.placements.setdefault(d.job_id, []).append(d.placement)
        rec.note(states, exits, decisions)
        rec.sample_reasons(sched, t)
        t_first = t if t_first is None else t_first
        t_last = t
    if sched is None or t_first is None:
        raise HistoryError("the event log is empty: no job was ever submitted to this database "
                           "(start `shepherd server` and submit jobs first)")
    rec.harvest(sched)
    rec.close_reasons()
    return Replay(sched, rec, policies, t_first, t_last)

"""Discrete-event simulator: drives the same ``Scheduler`` the daemon drives.

The simulator owns what the scheduler must not see: each job's true duration. It turns
the scheduler's decisions into future events (a started job exits when its work is
done; a preempted or stopped job exits at the end of its grace period; a stopped job
that finishes inside its grace period completes, a preempted one is requeued all the
same, as the daemon does - note 048) and feeds them back, one instant at a time.

Work model (the public scenario conventions): a checkpointable job that is preempted or
requeued by an operator keeps the work it did before the signal; one that does not
checkpoint restarts from zero; a run lost with its node or GPU is lost.

Victims (design note 026): by default a victim checkpoints at the signal and holds its
GPUs for its whole grace period. A job may answer preemption signals otherwise
(``SimJob.signal_answers``): exit sooner, or not exit at all - then it is killed at the
end of its grace period and keeps only the work of its last periodic checkpoint
(``SimJob.checkpoint_every_s``), not the seconds it ran.
"""

from __future__ import annotations

import gc
import heapq
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpushepherd.core.scheduler import Scheduler, SpecError, validate_spec
from gpushepherd.model.access import class_refusal
from gpushepherd.model.decisions import Preempt, ReconfigureMig, Reject, Start, Stop
from gpushepherd.model.events import Event, JobAdopted, JobFinished, JobSubmitted, MigReconfigured, Tick
from gpushepherd.model.job import ExitStatus, JobSpec, JobState
from gpushepherd.model.placement import Placement
from gpushepherd.model.rules import Rules

INF = float("inf")
#: wall-clock seconds between progress calls unless ``Simulator(progress_every_s=...)`` says
PROGRESS_EVERY_S = 0.25


@dataclass(frozen=True, slots=True)
class SignalAnswer:
    """How a job answers one preemption signal (design note 026).

    Attributes:
        exit_after_s: seconds from the signal to its exit; ``None``: it does not exit by
            itself (it ignores the signal). One that has not exited when its grace
            period ends is killed then: ``None`` and any value above the grace period
            mean a kill at ``signal + grace + late_s``.
        checkpointed: on an exit of its own, it saved its work at the signal (the
            daemon's exit code 85); ``False``: it died without saving (SIGTERM's
            default action). A killed job never saved at the signal.
        late_s: seconds between the kill and the exit its driver saw (the daemon notices
            exits at its next loop step); kills only.
        kept_s: a run that ends without a save at the signal keeps this many seconds of
            its work (its last checkpoint, as ``whatif`` infers it from a log; never more
            than the run's length); ``None``: its last periodic checkpoint
            (``SimJob.checkpoint_every_s``), or nothing.
    """

    exit_after_s: float | None = None
    checkpointed: bool = True
    late_s: float = 0.0
    kept_s: float | None = None

    def outcome(self, grace_s: float) -> tuple[float, bool]:
        """``(seconds from the signal to the exit, whether the work done before the
        signal is kept)`` under a grace period of ``grace_s`` seconds. A job that is
        killed, or exits without saving, keeps only its last periodic checkpoint."""
        d = self.exit_after_s
        if d is None or d > grace_s:
            return grace_s + self.late_s, False
        return d, self.checkpointed


@dataclass(frozen=True, slots=True)
class SimJob:
    """A job to replay: what the user submits and how long it really runs (``None``:
    until cancelled).

    ``signal_answers``: how it answers its 1st, 2nd, ... preemption signal (the last
    one repeats; none: it saves at the signal and holds its GPUs for the whole grace
    period). ``checkpoint_every_s``: it also checkpoints by itself every this many
    seconds of a run, which is what a run ended without a save at the signal keeps
    (``None``: never: such a run's work is lost).
    """

    spec: JobSpec
    duration: float | None
    signal_answers: tuple[SignalAnswer, ...] = ()
    checkpoint_every_s: float | None = None


@dataclass(frozen=True, slots=True)
class Restart:
    """The scheduler process restarts at ``t``: its state is saved, and a new scheduler
    is built from the saved jobs only (``Scheduler.snapshot`` / ``restore``)."""

    t: float


@dataclass(slots=True)
class JobRecord:
    """What happened to one job; times in seconds on the trace's axis."""

    spec: JobSpec
    duration: float | None
    starts: list[tuple[float, Placement]] = field(default_factory=list)
    preempted_at: list[float] = field(default_factory=list)
    end: float | None = None
    state: str = "PENDING"
    reasons: list[list] = field(default_factory=list)  # [from, to, reason] while pending
    # simulator-private progress
    work_done: float = 0.0
    run: int = 0
    run_start: float = 0.0
    exit_at: float = INF
    exit_status: ExitStatus = ExitStatus.COMPLETED
    gpu_seconds: float = 0.0
    signal_t: float | None = None
    #: times a MIG reconfiguration was requested for this job
    reconfigurations: list[float] = field(default_factory=list)
    #: why it was refused at submit (state ``REJECTED``): the core's ``Reject`` reason,
    #: or the ``SpecError`` of its submit validation; '' otherwise
    rejected: str = ""
    signal_answers: tuple[SignalAnswer, ...] = ()
    checkpoint_every_s: float | None = None
    #: the current run keeps the work before its signal when it exits (False: a kill,
    #: or an exit without a save: only its last checkpoint)
    keeps_signal_work: bool = True
    #: the answer's ``kept_s`` for the current run
    kept_s: float | None = None

    @property
    def first_start(self) -> float | None:
        return self.starts[0][0] if self.starts else None


@dataclass
class SimResult:
    """Per-job records and cluster-level integrals of one simulation."""

    records: dict[str, JobRecord]
    capacity_gpu_s: float
    busy_gpu_s: float
    t_first: float
    t_last: float
    decisions: int
    scheduler: Scheduler
    usage_timeline: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    usage_probes: dict[float, dict[tuple, float]] = field(default_factory=dict)
    #: ``(t, free GPUs, stranded GPUs, {constraint: GPUs})`` sampled every
    #: ``stranded_every_s`` (``Scheduler.stranded_capacity``)
    stranded: list[tuple[float, float, float, dict[str, float]]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SimProgress:
    """Where a replay stands, for a progress bar (``Simulator(on_progress=...)``).

    Attributes:
        t: the instant just simulated, seconds on the trace's axis.
        t_first / t_last_submit: the first and the last submit time of the jobs.
        submitted / finished / total: jobs submitted so far, ended so far (rejected
            included), and all jobs.
        instants: simulated instants so far.
    """

    t: float
    t_first: float
    t_last_submit: float
    submitted: int
    finished: int
    total: int
    instants: int

    @property
    def done(self) -> int:
        """Submissions plus ends so far, out of ``2 * total``: moves while the trace is
        submitted and while its jobs drain."""
        return self.submitted + self.finished


class SimInterrupted(KeyboardInterrupt):
    """A replay stopped by ``KeyboardInterrupt`` (Ctrl-C, or raised by a progress
    callback): ``result`` holds what was simulated up to ``result.t_last`` (jobs ended
    so far, integrals up to then; the others as they stood). Still a
    ``KeyboardInterrupt`` for a caller that does not look."""

    def __init__(self, result: SimResult, progress: SimProgress):
        super().__init__(f"simulation interrupted at t={progress.t:g} s with {progress.finished:,} of "
                         f"{progress.total:,} jobs ended")
        self.result, self.progress = result, progress


class Simulator:
    """Replay ``jobs`` (and operator/hardware ``events``) through a fresh scheduler.

    Args:
        rules: the compiled policy.
        jobs: jobs with true durations; their submit times drive the replay.
        events: extra events (cancel, requeue, node or GPU changes, restarts). A job
            with a ``JobAdopted`` event is already running from that event on and is
            not submitted.
        record_reasons: keep pending jobs' reasons over time: ``True`` for every job
            (small runs only: it asks for every pending job's reason after each
            instant), or a set of job ids.
        check_invariants: call ``Scheduler.check_invariants`` after each instant.
        progress: called as ``progress(jobs_finished, jobs_total)`` at most every
            ``progress_every_s`` seconds of wall time (checked after each instant) and
            at the end.
        on_progress: called likewise with a ``SimProgress``. Neither callback changes
            a decision; one that raises ``KeyboardInterrupt`` stops the replay with
            ``SimInterrupted`` (as Ctrl-C does).
        progress_every_s: wall-clock seconds between progress calls (default
            ``PROGRESS_EVERY_S``; 0: after every instant).
        scheduler: builds the scheduler from ``rules`` (default: gpushepherd's core;
            ``gpushepherd.baselines`` has others). Restarts, reasons and invariant checks
            need the core.
        stranded_every_s: sample free and stranded GPU capacity after the first
            instant at or past every multiple of this many seconds (>= 1; ``None``:
            never).
        reject_invalid: a submission the core's submit validation refuses
            (``validate_spec``: a time limit above the class's maximum, a sharing kind
            the class forbids, ...) is recorded as ``REJECTED`` with the ``SpecError``
            text in ``JobRecord.rejected``, and the run goes on - what the daemon's
            submitter sees as a refusal (note 026). Default: ``SpecError`` ends the run.
    """

    def __init__(self, rules: Rules, jobs: list[SimJob], events: list[Event | Restart] | None = None, *,
                 record_reasons: bool | set[str] = False, check_invariants: bool = False,
                 progress: Callable[[int, int], None] | None = None,
                 on_progress: Callable[[SimProgress], None] | None = None, progress_every_s: float | None = None,
                 track_usage: Callable[[JobSpec], str | None] | None = None,
                 probe_times: tuple[float, ...] = (),
                 scheduler: Callable[[Rules], Scheduler] | None = None,
                 stranded_every_s: float | None = None, reject_invalid: bool = False):
        if stranded_every_s is not None and not 1 <= stranded_every_s < float("inf"):
            raise ValueError(f"stranded_every_s: {stranded_every_s!r} is not allowed: seconds >= 1")
        self.stranded_every_s = stranded_every_s
        self.reject_invalid = reject_invalid
        self.stranded: list[tuple[float, float, float, dict[str, float]]] = []
        self.rules = rules
        self.sched = (scheduler or Scheduler)(rules)
        self.jobs = jobs
        self.events = list(events or [])
        self.record_reasons = record_reasons
        self.check = check_invariants
        self.progress = progress
        self.on_progress = on_progress
        self.progress_every_s = PROGRESS_EVERY_S if progress_every_s is None else progress_every_s
        self.track_usage = track_usage
        self.records: dict[str, JobRecord] = {}
        #: decayed usage of every entity right after each probe time: {t: {key: GPU-seconds}}
        self.probe_times = tuple(sorted(set(probe_times)))
        self.usage_probes: dict[float, dict[tuple, float]] = {}
        self._heap: list[tuple[float, int, int, object]] = []
        self._n = 0

    def _push(self, t: float, kind: int, payload: object) -> None:
        self._n += 1
        heapq.heappush(self._heap, (t, kind, self._n, payload))

    def run(self) -> SimResult:
        """Run to the end (no events left). Returns the records and integrals."""
        freezing = gc.isenabled() and gc.get_freeze_count() == 0  # (see the loop)
        if freezing:
            gc.freeze()  # the jobs to replay
        adopted = {e.spec.id for e in self.events if isinstance(e, JobAdopted)}
        # submissions are known up front: a sorted list beside the heap, which then holds
        # only what the replay makes (exits, ticks) and the events (note 059)
        subs: list[tuple[float, int, JobSpec]] = []
        for sj in self.jobs:
            if sj.spec.id in self.records:
                if freezing:
                    gc.unfreeze()
                raise ValueError(f"job id {sj.spec.id!r} appears twice")
            self.records[sj.spec.id] = JobRecord(sj.spec, sj.duration, signal_answers=sj.signal_answers,
                                                 checkpoint_every_s=sj.checkpoint_every_s)
            if sj.spec.id not in adopted:
                self._n += 1
                subs.append((sj.spec.submit_time, self._n, sj.spec))
        for e in self.events:
            self._push(e.t, 1, e)
        for t in self.probe_times:
            self._push(t, 3, None)
        sched = self.sched
        ticks: set[float] = set()
        total = len(self.jobs)
        finished = 0
        submitted = 0
        instants = 0
        t_last_submit = max((sj.spec.submit_time for sj in self.jobs), default=0.0)
        reporting = self.progress is not None or self.on_progress is not None
        next_report = time.monotonic() + self.progress_every_s if reporting else INF
        t_prev = None
        next_sample = None
        capacity_gpu_s = 0.0
        busy_gpu_s = 0.0
        held = 0
        t_first = min((sj.spec.submit_time for sj in self.jobs), default=0.0)
        t_last = t_first
        n_decisions = 0
        usage: dict[str, int] = {}
        timeline: dict[str, list[tuple[float, int]]] = {}
        heap = self._heap
        records = self.records
        subs.sort(key=lambda s: (s[0], s[1]))
        si, n_subs = 0, len(subs)
        t = t_first
        # what a replay builds lives on to its end (jobs, records, histories) and a pass
        # leaves no cycles: the cyclic collector is kept off it, every object it made
        # frozen as the replay goes (``gc.freeze``), and all unfrozen at the end - its
        # full collections walked the whole replay again and again (note 059)
        try:
            while heap or si < n_subs:
                t = heap[0][0] if heap else INF
                if si < n_subs and subs[si][0] < t:
                    t = subs[si][0]
                batch: list[Event] = []
                restart = False
                # the heap's order at one instant: exits, events, submissions, ticks
                items = []
                while heap and heap[0][0] == t and heap[0][1] < 2:
                    items.append(heapq.heappop(heap))
                while si < n_subs and subs[si][0] == t:
                    items.append((t, 2, 0, subs[si][2]))
                    si += 1
                while heap and heap[0][0] == t:
                    items.append(heapq.heappop(heap))
                for _t, kind, _n, payload in items:
                    if kind == 0:  # exit of a run
                        job_id, run = payload
                        rec = records[job_id]
                        if rec.run == run and rec.exit_at == t:
                            rec.exit_at = INF
                            batch.append(JobFinished(t, job_id, rec.exit_status))
                    elif kind == 1:
                        if isinstance(payload, Restart):
                            restart = True
                        else:
                            batch.append(payload)
                    elif kind == 2:
                        submitted += 1
                        refused = self._refusal(payload) if self.reject_invalid else ""
                        if refused:
                            rec = records[payload.id]
                            rec.state, rec.end, rec.rejected = "REJECTED", t, refused
                            finished += 1
                        else:
                            batch.append(JobSubmitted(t, payload))
                    else:
                        ticks.discard(t)
                        batch.append(Tick(t))
                cap_before, held_before = sched.ledger.healthy_total, held
                if restart:
                    snap = json.loads(json.dumps(sched.snapshot()))
                    # the same kind of core as before (a reference core restarts as one)
                    sched = self.sched = type(sched).restore(self.rules, snap, reference=sched.reference)
                decisions = sched.handle(batch) if batch else []
                n_decisions += len(decisions)
                # Runs that ended in this instant close first: the scheduler may already
                # have restarted the same job (a requeued job) in this instant's pass.
                for e in batch:
                    if isinstance(e, JobFinished):
                        rec = records[e.job_id]
                        held -= self._close_run(rec, t, bank=e.status is ExitStatus.PREEMPTED)
                        if self.track_usage is not None:
                            self._usage(usage, timeline, rec.spec, -rec.spec.gpus, t)
                    elif isinstance(e, JobAdopted):
                        at = e.started_at if e.started_at is not None else t
                        decisions.insert(0, Start(at, e.spec.id, e.placement))
                for d in decisions:
                    rec = records[d.job_id]
                    if isinstance(d, Start):
                        self._on_start(rec, d)
                        held += self._gpus_of(rec)
                        if self.track_usage is not None:
                            self._usage(usage, timeline, rec.spec, d.placement.gpu_count, t)
                    elif isinstance(d, Preempt):
                        rec.preempted_at.append(t)
                        self._preempt(rec, t, d.grace_s)
                    elif isinstance(d, Stop):
                        if d.requeue or d.reason == "cancelled":
                            held -= self._close_run(rec, t, bank=d.reason == "requeue")
                            if self.track_usage is not None:
                                self._usage(usage, timeline, rec.spec, -rec.spec.gpus, t)
                        else:
                            self._signal(rec, t, d.grace_s, ExitStatus.TIMEOUT)
                    elif isinstance(d, ReconfigureMig):
                        rec.reconfigurations.append(t)
                        self._push(t + self.rules.mig_reconfigure_delay_s, 1,
                                   MigReconfigured(t + self.rules.mig_reconfigure_delay_s, d.node, d.gpu, d.layout))
                    elif isinstance(d, Reject):
                        rec.end = t
                        rec.state = "REJECTED"
                        rec.rejected = d.reason
                        finished += 1
                # jobs that ended in this instant (an exit, or a cancel while pending)
                for e in batch:
                    job_id = getattr(e, "job_id", None)
                    if job_id and records[job_id].end is None:
                        job = sched.jobs.get(job_id)
                        if job is not None and job.state.terminal:
                            records[job_id].end = t
                            records[job_id].state = job.state.value
                            finished += 1
                # Capacity and busy GPU-seconds are integrated up to the last instant
                # where something happened to a job; a leftover wake-up (the time limit
                # of a job that already ended) neither stretches the makespan nor counts.
                if decisions or restart or any(not isinstance(e, Tick) for e in batch):
                    if t_prev is not None:
                        capacity_gpu_s += cap_before * (t - t_prev)
                        busy_gpu_s += held_before * (t - t_prev)
                    t_prev = t
                    t_last = t
                if self.record_reasons:
                    self._record_reasons(t)
                if t in self.probe_times:
                    self.usage_probes[t] = {key: sched.usage.value(key, t) for key in sorted(sched.usage.entries)}
                if self.check:
                    sched.check_invariants()
                every = self.stranded_every_s
                if every is not None and (next_sample is None or t >= next_sample):
                    report = sched.stranded_capacity()
                    self.stranded.append((t, report["free_gpus"], report["stranded_gpus"], report["by_constraint"]))
                    next_sample = (t // every + 1) * every
                wake = sched.next_wakeup()
                if wake is not None and wake > t and wake not in ticks:
                    ticks.add(wake)
                    self._push(wake, 3, None)
                instants += 1
                if freezing:
                    gc.freeze()
                if time.monotonic() >= next_report:
                    self._report(SimProgress(t, t_first, t_last_submit, submitted, finished, total, instants))
                    next_report = time.monotonic() + self.progress_every_s
        except KeyboardInterrupt:
            interrupted: SimProgress | None = SimProgress(t, t_first, t_last_submit, submitted, finished, total,
                                                          instants)
        else:
            interrupted = None
        finally:
            if freezing:
                gc.unfreeze()
        for job_id, rec in records.items():
            job = sched.jobs.get(job_id)
            if job is not None and not job.state.terminal:
                rec.state = job.state.value
        result = SimResult(records, capacity_gpu_s, busy_gpu_s, t_first, t_last, n_decisions, sched, timeline)
        result.usage_probes = self.usage_probes
        result.stranded = self.stranded
        if interrupted is not None:
            raise SimInterrupted(result, interrupted)
        if reporting:
            self._report(SimProgress(t, t_first, t_last_submit, submitted, finished, total, instants))
        return result

    def _refusal(self, spec: JobSpec) -> str:
        """The submit refusal of ``spec`` ('' when it is taken): the core's submit
        validation, then a class the team may never use (``class_refusal``), as the
        daemon's submit refuses them."""
        try:
            validate_spec(self.rules, spec)
        except SpecError as exc:
            return str(exc)
        why = class_refusal(self.rules, spec)
        return f"job {spec.id!r}: {why}" if why is not None else ""

    def _report(self, p: SimProgress) -> None:
        if self.progress is not None:
            self.progress(p.finished, p.total)
        if self.on_progress is not None:
            self.on_progress(p)

    # -- decisions -> future events -------------------------------------------
    def _on_start(self, rec: JobRecord, d: Start) -> None:
        t = d.t
        rec.starts.append((t, d.placement))
        rec.state = "RUNNING"
        rec.run += 1
        rec.run_start = t
        if rec.duration is None:
            rec.exit_at = INF
            return
        job = self.sched.jobs[rec.spec.id]
        remaining = rec.duration - rec.work_done if job.checkpointable else rec.duration
        rec.exit_at = t + max(0.0, remaining)
        rec.exit_status = ExitStatus.COMPLETED
        self._push(rec.exit_at, 0, (rec.spec.id, rec.run))

    def _signal(self, rec: JobRecord, t: float, grace: float, status: ExitStatus) -> None:
        """A signal at ``t``: the run exits ``grace`` seconds later with ``status``. A
        run whose work ends sooner exits then: a stopped one completes (the core ends it
        as its stop says); a preempted one is ``PREEMPTED`` all the same - its exit comes
        after the signal, and the daemon requeues such a run whatever its code (note 048)."""
        if t + grace < rec.exit_at:
            rec.exit_at = t + grace
            rec.exit_status = status
            rec.signal_t = t
            self._push(rec.exit_at, 0, (rec.spec.id, rec.run))
        elif status is ExitStatus.PREEMPTED:
            rec.exit_status = status
            rec.signal_t = t

    def _preempt(self, rec: JobRecord, t: float, grace: float) -> None:
        """The victim answers its k-th signal with ``signal_answers[k]`` (the last one
        repeats); without answers it saves and exits when its grace period ends."""
        answers = rec.signal_answers
        if not answers:
            rec.keeps_signal_work = True
            self._signal(rec, t, grace, ExitStatus.PREEMPTED)
            return
        answer = answers[min(len(rec.preempted_at), len(answers)) - 1]
        after, rec.keeps_signal_work = answer.outcome(grace)
        rec.kept_s = answer.kept_s
        self._signal(rec, t, after, ExitStatus.PREEMPTED)

    def _close_run(self, rec: JobRecord, t: float, bank: bool) -> int:
        """A run ends at ``t``; returns the GPUs it held. With ``bank`` the work done
        before the signal is kept (checkpointable jobs only)."""
        job = self.sched.jobs[rec.spec.id]
        gpus = self._gpus_of(rec)
        rec.gpu_seconds += (t - rec.run_start) * gpus
        rec.state = "ENDED"
        if bank and job.checkpointable:
            signal_t = rec.signal_t
            if signal_t is not None and signal_t >= rec.run_start and not rec.keeps_signal_work:
                rec.work_done += self._last_checkpoint(rec, t)  # killed, or exited without a save
            else:
                rec.work_done += (signal_t if signal_t is not None and signal_t >= rec.run_start else t) - rec.run_start
        elif not job.checkpointable:
            rec.work_done = 0.0
        rec.signal_t = None
        rec.keeps_signal_work, rec.kept_s = True, None
        rec.exit_at = INF
        rec.run += 1  # any exit still queued for the closed run is stale now
        return gpus

    @staticmethod
    def _last_checkpoint(rec: JobRecord, t: float) -> float:
        """Seconds of the run ending at ``t`` that its last checkpoint saved: the
        answer's ``kept_s``, else by ``checkpoint_every_s`` (none: 0); never more than
        the run's length or the work left."""
        ran = t - rec.run_start
        every = rec.checkpoint_every_s
        if rec.kept_s is not None:
            saved = min(rec.kept_s, ran)
        elif every is not None:
            saved = ran // every * every
        else:
            return 0.0
        left = INF if rec.duration is None else rec.duration - rec.work_done
        return max(0.0, min(saved, left))

    def _gpus_of(self, rec: JobRecord) -> float:
        """GPUs a run holds: whole GPUs, or a share's fraction of one (quota units)."""
        if rec.spec.share is None:
            return rec.spec.gpus
        return self.sched.jobs[rec.spec.id].fraction

    def _usage(self, usage: dict, timeline: dict, spec: JobSpec, delta: int, t: float) -> None:
        key = self.track_usage(spec)
        if key is None:
            return
        usage[key] = usage.get(key, 0) + delta
        line = timeline.setdefault(key, [])
        if line and line[-1][0] == t:
            line[-1] = (t, usage[key])
        else:
            line.append((t, usage[key]))

    def _record_reasons(self, t: float) -> None:
        sched = self.sched
        if self.record_reasons is True:
            pending = {j.id for j in sched.pending_jobs()}
            watched = self.records.items()
        else:
            watched = [(j, self.records[j]) for j in sorted(self.record_reasons) if j in self.records]
            pending = {j for j, _ in watched if j in sched.jobs and sched.jobs[j].state is JobState.PENDING}
        for job_id, rec in watched:
            open_ = rec.reasons and rec.reasons[-1][1] is None
            if job_id in pending:
                reason = str(sched.pending_reason(job_id))
                if open_ and rec.reasons[-1][2] == reason:
                    continue
                if open_:
                    rec.reasons[-1][1] = t
                rec.reasons.append([t, None, reason])
            elif open_:
                rec.reasons[-1][1] = t

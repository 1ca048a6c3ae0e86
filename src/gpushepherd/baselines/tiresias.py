"""Tiresias-like discretised two-dimensional LAS (Gu et al., "Tiresias: A GPU Cluster
Manager for Distributed Deep Learning", NSDI 2019, section 4.1).

No runtime knowledge: a job's priority is its *attained service*, GPUs x seconds run
so far (the two dimensions: space and time). Jobs are in ``K`` queues by attained
service, cut at ``thresholds`` (GPU-seconds; default one cut at 3,600 GPU-s, K = 2,
which the paper reports as enough); a lower queue index wins, and inside a queue jobs
run first come, first served by the time they entered it. Whenever a job arrives,
ends or crosses a threshold, the scheduler walks jobs in that order and gives GPUs to
every job that still fits the GPUs left (work-conserving, skipping jobs that do not
fit, at most ``SCAN_LIMIT`` pending jobs a pass); running jobs left out are preempted
and resume later from their checkpoint (Tiresias assumes checkpoints). Starvation
promotion (the paper's ``STARVELIMIT``) is left out.

Placement: Tiresias consolidates only jobs whose models are skew-sensitive; this
baseline spreads any job over any free GPUs (fullest node first), which is *easier*
than gpushepherd's gang placement - a favourable simplification for the baseline.

Interface: what ``Simulator`` needs of a scheduler (``handle``, ``next_wakeup``,
``jobs`` with ``state`` and ``checkpointable``, ``ledger.healthy_total``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from gpushepherd.model import JobFinished, JobSubmitted, Placement, Preempt, Start
from gpushepherd.model.job import ExitStatus, JobSpec, JobState
from gpushepherd.model.rules import Rules

INF = float("inf")
SCAN_LIMIT = 1000


@dataclass(eq=False)
class _Job:
    spec: JobSpec
    state: JobState = JobState.PENDING
    checkpointable: bool = True
    preemptible: bool = True
    attained: float = 0.0  # GPU-seconds run so far
    run_start: float = 0.0
    queue: int = 0
    entered: float = 0.0  # when it entered its queue
    alloc: list[tuple[int, list[int]]] = field(default_factory=list)

    @property
    def key(self) -> tuple:
        return (self.queue, self.entered, self.spec.submit_time, self.spec.id)


class _Ledger:
    def __init__(self, rules: Rules):
        self.names = [n.name for n in rules.nodes]
        self.free = [list(range(n.gpus)) for n in rules.nodes]
        self.healthy_total = sum(n.gpus for n in rules.nodes)
        self.free_total = self.healthy_total


class TiresiasScheduler:
    """Discretised 2D-LAS over the policy's nodes (classes, quotas and teams ignored)."""

    def __init__(self, rules: Rules, thresholds: tuple[float, ...] = (3600.0,)):
        self.rules = rules
        self.thresholds = tuple(sorted(thresholds))
        self.ledger = _Ledger(rules)
        self.jobs: dict[str, _Job] = {}
        self.now = -INF
        self._pending: list[tuple[tuple, _Job]] = []  # sorted by key
        self._running: dict[str, _Job] = {}

    # -- what the simulator calls --------------------------------------------
    def handle(self, events) -> list:
        out: list = []
        for e in events:
            self.now = max(self.now, e.t)
            self._refresh(self.now)
            if isinstance(e, JobSubmitted):
                job = _Job(e.spec, entered=e.t)
                self.jobs[e.spec.id] = job
                self._enqueue(job)
            elif isinstance(e, JobFinished):
                job = self.jobs[e.job_id]
                self._release(job)
                if e.status is ExitStatus.PREEMPTED:
                    job.state = JobState.PENDING
                    self._enqueue(job)
                else:
                    job.state = JobState.COMPLETED if e.status is ExitStatus.COMPLETED else JobState.FAILED
        self._refresh(self.now)
        self._schedule(out)
        return out

    def next_wakeup(self) -> float | None:
        """The next time a running job crosses a queue threshold."""
        best = None
        for job in self._running.values():
            if job.state is not JobState.RUNNING or job.queue >= len(self.thresholds):
                continue
            t = job.run_start + (self.thresholds[job.queue] - job.attained) / job.spec.gpus
            if t > self.now and (best is None or t < best):
                best = t
        return best

    def pending_jobs(self) -> list:
        """Pending jobs in 2D-LAS order (a copy)."""
        return [j for _, j in self._pending]

    # -- internals -----------------------------------------------------------
    def _queue_of(self, attained: float) -> int:
        return bisect.bisect_right(self.thresholds, attained)

    def _refresh(self, t: float) -> None:
        """Charge running jobs their service up to ``t``; demote those past a threshold."""
        for job in self._running.values():
            if job.state is not JobState.RUNNING:
                continue
            job.attained += (t - job.run_start) * job.spec.gpus
            job.run_start = t
            q = self._queue_of(job.attained)
            if q != job.queue:
                job.queue, job.entered = q, t

    def _enqueue(self, job: _Job) -> None:
        bisect.insort(self._pending, (job.key, job), key=lambda x: x[0])

    def _release(self, job: _Job) -> None:
        self._running.pop(job.spec.id, None)
        led = self.ledger
        for idx, gpus in job.alloc:
            led.free[idx].extend(gpus)
            led.free[idx].sort()
            led.free_total += len(gpus)
        job.alloc = []

    def _schedule(self, out: list) -> None:
        budget = self.ledger.healthy_total
        running = sorted((j for j in self._running.values() if j.state is JobState.RUNNING), key=lambda j: j.key)
        exiting = sum(j.spec.gpus for j in self._running.values() if j.state is not JobState.RUNNING)
        budget -= exiting
        keep: set[str] = set()
        start: list[_Job] = []
        i = k = scanned = 0
        pend = self._pending
        while (i < len(running) or k < len(pend)) and budget > 0:
            if k >= len(pend) or (i < len(running) and running[i].key < pend[k][0]):
                job = running[i]
                i += 1
                if job.spec.gpus <= budget:
                    keep.add(job.spec.id)
                    budget -= job.spec.gpus
            else:
                job = pend[k][1]
                k += 1
                scanned += 1
                if job.spec.gpus <= budget:
                    start.append(job)
                    budget -= job.spec.gpus
                if scanned >= SCAN_LIMIT:
                    break
        for job in running:
            if job.spec.id not in keep:
                job.state = JobState.PREEMPTING
                out.append(Preempt(self.now, job.spec.id, grace_s=0.0, reason="tiresias:las"))
        started = set()
        for job in start:
            if job.spec.gpus > self.ledger.free_total:
                continue  # its GPUs are still held by exiting victims: next pass
            self._place(job)
            started.add(job.spec.id)
            out.append(Start(self.now, job.spec.id, Placement(tuple(
                (self.ledger.names[idx], tuple(g)) for idx, g in job.alloc))))
        if started:
            self._pending = [(key, j) for key, j in pend if j.spec.id not in started]

    def _place(self, job: _Job) -> None:
        led = self.ledger
        need = job.spec.gpus
        order = sorted((idx for idx in range(len(led.free)) if led.free[idx]),
                       key=lambda idx: (len(led.free[idx]) < need, len(led.free[idx]) if len(led.free[idx]) >= need
                                        else -len(led.free[idx]), idx))
        for idx in order:
            if need == 0:
                break
            take = led.free[idx][:need]
            del led.free[idx][:len(take)]
            job.alloc.append((idx, take))
            need -= len(take)
            led.free_total -= len(take)
        job.state = JobState.RUNNING
        job.run_start = self.now
        self._running[job.spec.id] = job


def baseline(rules: Rules):
    """``(rules, TiresiasScheduler)``."""
    return rules, TiresiasScheduler

"""Prometheus metrics of ``shepherd server`` (design note 011), served at ``/metrics``.

Gauges are computed at scrape time from the daemon's state (``GaugeCollector``, under
``Daemon.lock``); counters and histograms are updated by ``Metrics.observe`` after
every ``Scheduler.handle`` - in the reconcile loop and in the replay at start, so a
restart rebuilds them from the event log. Units are Prometheus's base units
(seconds, bytes, ratios) except the DCGM-exporter names (only with ``dcgm_names``,
note 019), which keep DCGM's (%, MiB, C, W). A scrape never waits on a stalled loop:
the gauges under the lock are left out when it is not free within
``SCRAPE_LOCK_TIMEOUT_S`` (note 019). The tails per size class and the fairness across
users (note 030) are gauges over the jobs that first started, or ended, in the last
``tail_window_s`` (default 7 days), computed by ``gpushepherd.tails.tail_figures`` from
what ``observe`` kept of them.
"""

from __future__ import annotations

import logging
import socket
from collections import Counter as Tally
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpushepherd.core.stranded import stranded_capacity
from gpushepherd.model.decisions import Decision, Preempt, Start, Stop
from gpushepherd.model.events import Event, JobSubmitted
from gpushepherd.model.job import JobState
from gpushepherd.tails import SIZE_CLASSES, slowdown, tail_figures

if TYPE_CHECKING:  # pragma: no cover
    from gpushepherd.daemon.server import Daemon

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: seconds a scrape waits for ``Daemon.lock`` before serving the lock-free metrics only
#: (under Prometheus's default scrape timeout of 10 s; note 019)
SCRAPE_LOCK_TIMEOUT_S = 5.0

#: what a FAILED run's stderr says when CUDA ran out of memory (PyTorch, the driver
#: API / CuPy / TensorFlow, ``torch.cuda.OutOfMemoryError``)
OOM_MARKERS = ("CUDA out of memory", "CUDA_ERROR_OUT_OF_MEMORY", "OutOfMemoryError")
OOM_TAIL_BYTES = 64 * 1024

#: seconds: a few seconds to a week (queueing delay, run duration)
JOB_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800, 86400, 172800, 604800,
               float("inf"))
#: seconds: one ``Scheduler.handle``
CYCLE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                 5.0, float("inf"))
MIB = 1024 * 1024
#: the constraint names of ``Scheduler.stranded_capacity`` (each exported, 0 included)
#: seconds: the window of the size-class tails and the fairness across users (note 030)
TAIL_WINDOW_S = 7 * 86400.0
#: final states whose jobs count in the slowdown figures (ran to an end of their own or a limit)
ENDED = (JobState.COMPLETED, JobState.FAILED, JobState.TIMEOUT)
#: the pending-reason codes of a job that waits for capacity (GPUs, their shape, victims,
#: its turn), not for its policy: a quota or a time window (QuotaExceeded, WindowLimit,
#: CohortQuota), a spec no cluster fits (ExceedsCapacity), or, kept by the daemon, its
#: user's hold, a dependency or a begin time (JobHeldUser, Dependency, BeginTime, ...).
#: ``gpushepherd_gpus_free_usable`` counts free GPUs such a job could be placed on;
#: deploy/prometheus/alerts.yaml names the same codes (a test checks they agree).
CAPACITY_REASONS = ("Resources", "NoFit", "NoPreemptibleVictims", "ReservedFor", "HeldForPreemptor",
                    "PreemptionInProgress", "Priority")
log = logging.getLogger("gpushepherd.daemon")
STRANDED_CONSTRAINTS = ("pool", "gpu_type", "gpu_memory", "node_selector", "taint", "driver", "cache", "sharing",
                        "single-node", "share-size", "mig-profile")


def cuda_oom_in(path: Path) -> bool:
    """Whether the last ``OOM_TAIL_BYTES`` of file ``path`` contain a CUDA
    out-of-memory message (``OOM_MARKERS``); ``False`` when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - OOM_TAIL_BYTES))
            tail = f.read().decode(errors="replace")
    except OSError:
        return False
    return any(m in tail for m in OOM_MARKERS)


def reason_code(reason: str | None) -> str:
    """A pending reason's code, its text up to ``(`` (``QuotaExceeded(teams.a.max_gpus=3,
    in use 3)`` -> ``QuotaExceeded``; ``None`` -> ``New``: not looked at yet). The code
    only, never the detail: a bounded label value."""
    return (reason or "").partition("(")[0] or "New"


def reason_kind(reason: str) -> str:
    """A preemption reason's kind: the core's reason up to ``:`` (``priority:training``
    -> ``priority``, ``window-closed:classes.batch.max_gpus`` -> ``window-closed``)."""
    return reason.partition(":")[0] or "unknown"


class Metrics:
    """The daemon's metrics: a registry of its own, the counters and histograms, the
    allocated-but-idle streaks, and the scrape-time gauges.

    Args:
        daemon: the ``Daemon`` whose state the gauges read (under ``daemon.lock``).
        idle_threshold_pct: percent GPU utilisation below which a sample is idle, for
            classes without ``idle_stop`` (the class's ``below_util_pct`` otherwise).
        idle_after_s: seconds of idle samples after which a job's GPUs count as
            allocated-but-idle, for classes without ``idle_stop`` (``after_s``
            otherwise).
        stderr_of: job id -> the stderr file of its last run (CUDA OOM detection).
        dcgm_names: also export the GPU samples under DCGM-exporter's names (note 019).
        tail_window_s: seconds back from now over which the size-class tails and the
            fairness across users are computed (note 030).
    """

    def __init__(self, daemon: "Daemon", idle_threshold_pct: float = 5.0, idle_after_s: float = 600.0,
                 stderr_of: Callable[[str], Path] | None = None, dcgm_names: bool = False,
                 tail_window_s: float = TAIL_WINDOW_S):
        if not 0 <= idle_threshold_pct <= 100:
            raise ValueError(f"idle_threshold_pct: {idle_threshold_pct!r} is not allowed: a percentage 0-100")
        if not idle_after_s > 0 or idle_after_s == float("inf"):
            raise ValueError(f"idle_after_s: {idle_after_s!r} is not allowed: seconds > 0, finite")
        if not 0 < tail_window_s < float("inf"):
            raise ValueError(f"tail_window_s: {tail_window_s!r} is not allowed: seconds > 0, finite")
        self.tail_window_s = tail_window_s
        self.daemon = daemon
        self.idle_threshold_pct, self.idle_after_s = idle_threshold_pct, idle_after_s
        self.stderr_of = stderr_of
        self.dcgm_names = dcgm_names
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.starts = Counter("gpushepherd_job_starts", "Runs started (Start decisions).", ["class", "team"],
                              registry=r)
        self.ends = Counter("gpushepherd_job_ends", "Jobs that reached a final state, by that state (COMPLETED, "
                            "FAILED, TIMEOUT, CANCELLED, REJECTED).", ["class", "team", "state"], registry=r)
        self.failures = Counter("gpushepherd_job_failures", "Jobs that ended FAILED, by cause (cuda-oom: CUDA "
                                "out of memory in the run's stderr; other).", ["class", "team", "cause"],
                                registry=r)
        self.preemptions = Counter("gpushepherd_job_preemptions", "Preempt decisions by reason (priority, "
                                   "reclaim, window-closed).", ["class", "team", "reason"], registry=r)
        self.stops = Counter("gpushepherd_job_stops", "Stop decisions by reason (time-limit, idle, memory-overrun, "
                             "cancelled, node-lost, ...).", ["class", "team", "reason"], registry=r)
        self.queueing_delay = Histogram("gpushepherd_job_queueing_delay_seconds", "Seconds from submission to a "
                                        "job's first start.", ["class"], buckets=JOB_BUCKETS, registry=r)
        self.run_duration = Histogram("gpushepherd_job_run_duration_seconds", "Seconds a run held its GPUs, by "
                                      "outcome (the final state, or requeued).", ["class", "outcome"],
                                      buckets=JOB_BUCKETS, registry=r)
        self.cycle = Histogram("gpushepherd_scheduling_cycle_duration_seconds", "Wall seconds of one "
                               "Scheduler.handle in the reconcile loop (not in the replay).", buckets=CYCLE_BUCKETS,
                               registry=r)
        self.http = Counter("gpushepherd_http_responses", "API responses by route template (the path as "
                            "declared, e.g. /jobs/{job_id}; 'unmatched' for no route) and status class (2xx, "
                            "3xx, 4xx, 5xx; an unhandled exception counts as 5xx), since this process started.",
                            ["route", "code"], registry=r)
        self._runs: dict[str, tuple[float, int]] = {}  # job holding GPUs -> (run start, run number)
        self._ended: set[str] = set()  # jobs counted in ends
        self._idle: dict[str, tuple[int, float]] = {}  # job -> (run, first idle sample's time)
        # the tails' window (note 030): first starts (t, job, gpus, user, wait s) and ends
        # (t, job, gpus, user, slowdown), oldest first; seconds held by each job's past runs
        self._first_starts: deque[tuple[float, str, float, str, float]] = deque()
        self._slow_ends: deque[tuple[float, str, float, str, float]] = deque()
        self._held_s: dict[str, float] = {}
        self._children: dict[tuple, Any] = {}  # (metric, label values) -> child (``child``)
        self.hostname = socket.gethostname()
        r.register(GaugeCollector(self))

    def exposition(self) -> bytes:
        """The text exposition format of every metric (``CONTENT_TYPE``)."""
        return generate_latest(self.registry)

    # ------------------------------------------------------------ counters (the loop and the replay)
    def observe(self, now: float, events: Iterable[Event], decisions: list[Decision]) -> None:
        """Count what one ``Scheduler.handle(events)`` at time ``now`` (seconds) did;
        called with the daemon's core already updated (the replay's and the loop's)."""
        sched = self.daemon.sched
        jobs = sched.jobs
        for d in decisions:
            job = jobs.get(d.job_id)
            if job is None:
                continue
            cls, team = job.spec.workload_class, job.spec.team
            if isinstance(d, Start):
                self.child(self.starts, cls, team).inc()
                self._runs[d.job_id] = (d.t, job.runs)
                if job.runs == 1:
                    wait = max(0.0, d.t - job.spec.submit_time)
                    self.child(self.queueing_delay, cls).observe(wait)
                    self._first_starts.append((d.t, d.job_id, job.fraction, job.spec.user, wait))
            elif isinstance(d, Preempt):
                self.preemptions.labels(cls, team, reason_kind(d.reason)).inc()
            elif isinstance(d, Stop):
                self.stops.labels(cls, team, d.reason or "unknown").inc()
        for job_id in sorted(self._runs):
            job = jobs[job_id]
            start, run = self._runs[job_id]
            if job.state.holds_gpus and job.runs == run:
                continue
            del self._runs[job_id]
            outcome = job.state.value if job.state.terminal else "requeued"
            self.child(self.run_duration, job.spec.workload_class, outcome).observe(max(0.0, now - start))
            self._held_s[job_id] = self._held_s.get(job_id, 0.0) + max(0.0, now - start)
        touched = {getattr(e, "job_id", None) or (e.spec.id if isinstance(e, JobSubmitted) else None)
                   for e in events}
        touched |= {d.job_id for d in decisions}
        for job_id in sorted(j for j in touched if j is not None):
            job = jobs.get(job_id)
            if job is None or not job.state.terminal or job_id in self._ended:
                continue
            self._ended.add(job_id)
            cls, team = job.spec.workload_class, job.spec.team
            self.child(self.ends, cls, team, job.state.value).inc()
            held = self._held_s.pop(job_id, 0.0)
            if job.state in ENDED:
                self._slow_ends.append((now, job_id, job.fraction, job.spec.user,
                                        slowdown(now - job.spec.submit_time, held)))
            if job.state is JobState.FAILED:
                oom = self.stderr_of is not None and cuda_oom_in(self.stderr_of(job_id))
                self.failures.labels(cls, team, "cuda-oom" if oom else "other").inc()

        self._prune(now)

    def _prune(self, now: float) -> None:
        for q in (self._first_starts, self._slow_ends):
            while q and q[0][0] < now - self.tail_window_s:
                q.popleft()

    def tails(self, now: float) -> dict[str, Any]:
        """``tail_figures`` of the jobs that first started (their waits) or ended (their
        slowdowns, JCT over the seconds their runs held GPUs) in the last
        ``tail_window_s`` before ``now``; per size class only ``started``, ``ended`` and
        the figures mean anything here (a job counts once, by its id)."""
        jobs: dict[str, list] = {}
        since = now - self.tail_window_s
        for t, job_id, gpus, user, wait in self._first_starts:
            if t >= since:
                jobs[job_id] = [gpus, wait, float("nan"), user]
        for t, job_id, gpus, user, slow in self._slow_ends:
            if t >= since:
                jobs.setdefault(job_id, [gpus, float("nan"), float("nan"), user])[2] = slow
        rows = [jobs[j] for j in sorted(jobs)]
        return tail_figures([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows])

    def child(self, metric, *values: str):
        """``metric.labels(*values)``, kept: a labelled child is never removed, and
        ``labels`` takes a lock and checks and converts the values on every call
        (four calls per submission in the loop, one per response; note 060)."""
        key = (metric, values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def observe_cycle(self, seconds: float) -> None:
        self.cycle.observe(seconds)

    # ------------------------------------------------------------ snapshots (note 017)
    _COUNTERS = ("starts", "ends", "failures", "preemptions", "stops")
    _HISTOGRAMS = ("queueing_delay", "run_duration")

    def state(self) -> dict:
        """The counters' and histograms' values and the runs being timed, as JSON data
        for a snapshot (``load``): a restart from a snapshot keeps them without
        replaying the log before it. Reads prometheus_client's per-label children."""
        def hist(child) -> list:
            return [[b.get() for b in child._buckets], child._sum.get()]
        out: dict[str, Any] = {}
        for name in self._COUNTERS:
            out[name] = [[list(labels), child._value.get()] for labels, child in getattr(self, name)._metrics.items()]
        for name in self._HISTOGRAMS:
            out[name] = [[list(labels), *hist(child)] for labels, child in getattr(self, name)._metrics.items()]
        out["cycle"] = hist(self.cycle)
        out["runs"] = {j: list(v) for j, v in self._runs.items()}
        out["tails"] = {"first_starts": [list(r) for r in self._first_starts],
                        "ends": [list(r) for r in self._slow_ends], "held_s": dict(self._held_s)}
        return out

    def load(self, state: dict) -> None:
        """Set the counters, histograms and timed runs from ``state()`` data."""
        def hist(child, buckets: list, total: float) -> None:
            for b, v in zip(child._buckets, buckets):
                b.set(v)
            child._sum.set(total)
        for name in self._COUNTERS:
            for labels, value in state.get(name, []):
                getattr(self, name).labels(*labels)._value.set(value)
        for name in self._HISTOGRAMS:
            for labels, buckets, total in state.get(name, []):
                hist(getattr(self, name).labels(*labels), buckets, total)
        if state.get("cycle"):
            hist(self.cycle, *state["cycle"])
        self._runs = {j: (float(v[0]), int(v[1])) for j, v in state.get("runs", {}).items()}
        tails = state.get("tails", {})  # absent in a snapshot from before note 030: empty
        self._first_starts = deque((float(t), j, float(g), u, float(w)) for t, j, g, u, w in tails.get("first_starts", []))
        self._slow_ends = deque((float(t), j, float(g), u, float(s)) for t, j, g, u, s in tails.get("ends", []))
        self._held_s = {j: float(v) for j, v in tails.get("held_s", {}).items()}

    # ------------------------------------------------------------ allocated-but-idle (the loop)
    def idle_rule(self, job) -> tuple[float, float]:
        """``(threshold %, after s)`` for a job: its class's ``idle_stop`` where the
        policy sets one, else the server's defaults."""
        rule = job.cls.idle_stop
        if rule is not None:
            return rule.below_util_pct, rule.after_s
        return self.idle_threshold_pct, self.idle_after_s

    def sampled(self, now: float) -> None:
        """Update the idle streaks after a GPU sample at ``now`` (``Daemon.sampled``:
        a job's ``gpu_util_pct``, ``None`` for a MIG instance, which counts as busy)."""
        d = self.daemon
        live = {}
        for job in d.sched.holding():
            if job.state is not JobState.RUNNING:
                continue
            rec = d.sampled.get(job.id)
            prev = self._idle.get(job.id)
            if prev is not None and prev[0] != job.runs:
                prev = None  # a new run starts a new streak
            if rec is None or rec.get("t") != now:
                if prev is not None:
                    live[job.id] = prev  # not sampled this time: the streak stands
                continue
            util = rec.get("gpu_util_pct")
            threshold, _after = self.idle_rule(job)
            if util is not None and util < threshold:
                live[job.id] = prev or (job.runs, now)
        self._idle = live

    def idle_jobs(self, now: float) -> list:
        """Jobs running whose idle streak has lasted their ``after`` seconds at ``now``."""
        jobs = self.daemon.sched.jobs
        out = []
        for job_id, (run, since) in sorted(self._idle.items()):
            job = jobs.get(job_id)
            if job is None or job.state is not JobState.RUNNING or job.runs != run:
                continue
            if now - since >= self.idle_rule(job)[1]:
                out.append(job)
        return out


class GaugeCollector(Collector):
    """The scrape-time gauges (design note 011), read under ``Daemon.lock``."""

    def __init__(self, metrics: Metrics):
        self.m = metrics

    def describe(self):
        return []  # computed at scrape time; nothing to check at registration

    def collect(self):
        d = self.m.daemon
        out = list(self._health(d))  # lock-free: served while the loop is stalled
        if not d.lock.acquire(timeout=SCRAPE_LOCK_TIMEOUT_S):
            return out
        try:
            if d.sched is None:
                return out
            return out + list(self._families(d, max(d.clock(), d.sched.now)))
        finally:
            d.lock.release()

    @staticmethod
    def _health(d: Daemon):
        """The loop's and the store's health (note 019), read without the lock."""
        yield _gauge("gpushepherd_scheduling_loop_last_step_timestamp_seconds", "Epoch seconds when the reconcile "
                     "loop last completed a step (the server's start before its first); time() minus it is the "
                     "loop's stall.", [], [((), d.last_step_wall)])
        errors = CounterMetricFamily("gpushepherd_store_errors", "Storage failures of the database (any statement, "
                                     "commit or connect) by cause: database is locked, disk full, read-only "
                                     "database, disk I/O error, database unreachable, ... (since this process "
                                     "started).", labels=["reason"])
        for reason, n in sorted(dict(d.store.errors).items()):
            errors.add_metric([reason], float(n))
        yield errors

    def _families(self, d: "Daemon", now: float):
        sched, rules = d.sched, d.rules
        classes = sorted(rules.classes)
        pending = sched.pending_jobs()
        queue: Tally = Tally((j.spec.workload_class, j.spec.team) for j in pending)
        teams = sorted(set(rules.teams) | {t for _c, t in queue} | {j.spec.team for j in sched.holding()})
        running: Tally = Tally()
        allocated: Tally = Tally()
        for job in sched.holding():
            running[(job.spec.workload_class, job.spec.team)] += 1
            allocated[(job.spec.workload_class, job.spec.team)] += job.fraction
        idle: Tally = Tally()
        for job in self.m.idle_jobs(now):
            idle[(job.spec.workload_class, job.spec.team)] += job.fraction
        pairs = sorted({(c, t) for c in classes for t in teams} | set(queue) | set(running))
        yield _gauge("gpushepherd_queue_length", "Jobs pending, per workload class and team.", ["class", "team"],
                     ((p, queue[p]) for p in pairs))
        oldest: dict[tuple[str, str], float] = {}
        for job in sched.pending_jobs():
            p = (job.spec.workload_class, job.spec.team)
            oldest[p] = min(oldest.get(p, now), pending_since(job))
        yield _gauge("gpushepherd_oldest_pending_seconds", "Seconds since the oldest pending job of a class and team "
                     "last became pending (its submission, or its requeue); 0 with none pending.", ["class", "team"],
                     ((p, max(0.0, now - oldest[p]) if p in oldest else 0.0) for p in pairs))
        yield _gauge("gpushepherd_jobs_running", "Jobs holding GPUs (running, preempting, stopping).",
                     ["class", "team"], ((p, running[p]) for p in pairs))
        yield _gauge("gpushepherd_gpus_allocated", "GPUs held by jobs (a share counts its fraction).",
                     ["class", "team"], ((p, allocated[p]) for p in pairs))
        yield _gauge("gpushepherd_gpus_allocated_idle", "GPUs held by running jobs whose utilisation samples "
                     "stayed below the idle threshold for the idle time (class idle_stop, else --idle-threshold-pct "
                     "and --idle-after).", ["class", "team"], ((p, idle[p]) for p in pairs))
        yield from self._reasons(d, sched, pending, now)
        stranded = sched.stranded_capacity()
        yield _gauge("gpushepherd_gpus_free", "GPUs nobody holds (healthy, in service; shares and MIG "
                     "instances as fractions).", [], [((), stranded["free_gpus"])])
        by = {k: 0.0 for k in STRANDED_CONSTRAINTS} | stranded["by_constraint"]
        yield _gauge("gpushepherd_gpus_stranded", "Free GPUs no pending job could use now, by the constraint that "
                     "strands them (note 007; 0 with nothing pending): sum() for all.", ["constraint"],
                     [((k,), v) for k, v in sorted(by.items())])
        yield from self._quota(sched, rules, teams)
        yield from self._tails(now)
        yield from self._gpus(d)

    def _reasons(self, d: "Daemon", sched, pending: list, now: float):
        """Pending jobs and the oldest of them by reason code (the core's pending jobs and
        the ones the daemon keeps from it: held, dependency, begin time; note 019), and
        the free GPUs a job waiting for capacity (``CAPACITY_REASONS``) could use."""
        count: Tally = Tally()
        oldest: dict[tuple[str, str, str], float] = {}
        capacity = {}
        rows = [(j, reason_code(str(r) if (r := sched.pending_reason(j.id)) is not None else None), pending_since(j))
                for j in pending]
        rows += [(k, reason_code(d.kept_why(k, now)), k.spec.submit_time)
                 for _id, k in sorted(d.kept.items()) if k.state == "PENDING"]
        for job, code, since in rows:
            key = (job.spec.workload_class, job.spec.team, code)
            count[key] += 1
            oldest[key] = min(oldest.get(key, now), since)
            if code in CAPACITY_REASONS and job.id in sched.jobs:
                capacity[job.id] = job
        keys = sorted(count)
        yield _gauge("gpushepherd_pending_jobs", "Jobs pending, per workload class, team and pending-reason code "
                     "(QuotaExceeded, Resources, Priority, ... and the daemon's JobHeldUser, Dependency, BeginTime; "
                     "the code only, the detail is in `shepherd why`); absent for a code no job has.",
                     ["class", "team", "reason"], ((k, count[k]) for k in keys))
        yield _gauge("gpushepherd_oldest_pending_by_reason_seconds", "Seconds since the oldest pending job of a "
                     "class and team with a pending-reason code last became pending (its submission, or its "
                     "requeue); absent for a code no job has.", ["class", "team", "reason"],
                     ((k, max(0.0, now - oldest[k])) for k in keys))
        usable = 0.0
        if capacity:  # the core's stranded measure over these jobs only: free minus what none of them can use
            found = stranded_capacity(SimpleNamespace(ledger=sched.ledger, jobs=capacity))
            usable = max(0.0, round(found["free_gpus"] - found["stranded_gpus"], 6))
        yield _gauge("gpushepherd_gpus_free_usable", "Free GPUs that a job pending for capacity (reason "
                     f"{', '.join(CAPACITY_REASONS)}) could be placed on now (its pool, type, memory, selector, "
                     "taints, shape: gpushepherd.core.stranded), though it waits; jobs held by a quota, a window, "
                     "a hold, a dependency or a begin time do not count. 0 with none.", [], [((), usable)])

    def _tails(self, now: float):
        fig = self.m.tails(now)
        days = f"{self.m.tail_window_s / 86400:g} days"
        sizes = fig["size_classes"]
        yield _gauge("gpushepherd_size_class_jobs", f"Jobs of a size class (GPUs: {', '.join(SIZE_CLASSES)}) that "
                     f"first started (what=started) or ended completed, failed or timed out (what=ended) in the last "
                     f"{days} (note 030).", ["size_class", "what"],
                     [((c, w), sizes[c][w]) for c in SIZE_CLASSES for w in ("started", "ended")])
        for name, key, doc in (
                ("gpushepherd_size_class_wait_seconds", "wait_s",
                 "Queueing delay (submit to first start) of the jobs of a size class that first started"),
                ("gpushepherd_size_class_slowdown_ratio", "slowdown",
                 "Bounded slowdown, max(1, JCT / max(seconds held, 10)), of the jobs of a size class that ended")):
            yield _gauge(name, f"{doc} in the last {days}: mean, p90, p99 or max (stat); absent with none (note 030).",
                         ["size_class", "stat"], [((c, stat), v) for c in SIZE_CLASSES
                                                  for stat, v in sizes[c][key].items() if v is not None])
        f = fig["fairness"]
        yield _gauge("gpushepherd_user_fairness_ratio", f"Jain's index over each user's mean bounded slowdown, users "
                     f"with at least {f['min_jobs']} jobs ended in the last {days} (1: all alike, 1/n: one user bears "
                     "the waiting; absent with no such user; note 030).", [],
                     [] if f["value"] is None else [((), f["value"])])

    def _quota(self, sched, rules, teams):
        book = sched.quota
        limit_rows, used_rows = [], []
        for i, lim in enumerate(book.limits):
            labels = (lim.path, lim.team or "", lim.workload_class or "", lim.unit.value)
            limit_rows.append((labels, book.current[i] / book.scale[i]))
        usage = dict(book.usage)
        for i, lim in enumerate(book.limits):
            if not lim.per_user:
                usage.setdefault((i, ""), 0)  # a limit nobody uses yet: 0, so a panel shows it
        for (i, user), used in sorted(usage.items()):
            lim = book.limits[i]
            used_rows.append(((lim.path, lim.team or "", lim.workload_class or "", lim.unit.value, user),
                              used / book.scale[i]))
        yield _gauge("gpushepherd_quota_limit", "A quota limit's value now (time windows applied), in its unit "
                     "(gpus or jobs); quota is the policy field.", ["quota", "team", "class", "unit"], limit_rows)
        yield _gauge("gpushepherd_quota_used", "What running jobs count against a quota limit, per user for a "
                     "per-user limit (user '' otherwise).", ["quota", "team", "class", "unit", "user"], used_rows)
        yield _gauge("gpushepherd_team_nominal_gpus", "A team's nominal (guaranteed) GPUs in its cohort.", ["team"],
                     [((t,), n) for t, n in sorted(rules.nominal_gpus.items())])
        t = sched.now
        yield _gauge("gpushepherd_team_fair_share_factor", "A team's fair-share factor (0-1; 1: used nothing).",
                     ["team"], [((team,), sched.fair_share_factor(team)) for team in teams])
        yield _gauge("gpushepherd_team_decayed_usage_gpu_seconds", "A team's decayed usage (GPU-seconds, "
                     "half-life of the policy).", ["team"],
                     [((team,), sched.usage.value(("team", team), t)) for team in teams])

    def _gpus(self, d: "Daemon"):
        if d.node is None or d.found is None:
            return
        node = d.node
        with_dcgm = self.m.dcgm_names
        dcgm = ["gpu", "UUID", "modelName", "Hostname"]
        ours = ["node", "gpu", "uuid"]
        names = [("DCGM_FI_DEV_GPU_UTIL", "GPU utilisation (in %)."),
                 ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
                 ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
                 ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
                 ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
                 ("gpushepherd_gpu_utilization_ratio", "GPU utilisation (0-1) at the last sample."),
                 ("gpushepherd_gpu_memory_used_bytes", "GPU memory used at the last sample."),
                 ("gpushepherd_gpu_memory_total_bytes", "GPU memory in total."),
                 ("gpushepherd_gpu_temperature_celsius", "GPU temperature at the last sample."),
                 ("gpushepherd_gpu_power_watts", "GPU power draw at the last sample.")]
        rows: dict[str, list] = {n: [] for n, _ in names}
        unmanaged = []
        for g in range(node.gpus):
            info = d.found.gpus[g] if g < len(d.found.gpus) else None
            uuid = (info.uuid if info else "") or ""
            model = (info.name if info else "") or node.gpu_type
            ld, lo = (str(g), uuid, model, self.m.hostname), (node.name, str(g), uuid)
            unmanaged.append((lo, 1.0 if d.unmanaged_flag.get((node.name, g), False) else 0.0))
            s = d.gpu_samples.get(g)
            if s is None:
                continue
            total = s.mem_total_mib or (info.memory_mib if info else None)
            values: dict[str, Any] = {
                "DCGM_FI_DEV_GPU_UTIL": s.util_pct, "DCGM_FI_DEV_FB_USED": s.mem_used_mib,
                "DCGM_FI_DEV_FB_FREE": total - s.mem_used_mib if total is not None and s.mem_used_mib is not None
                else None,
                "DCGM_FI_DEV_GPU_TEMP": s.temperature_c, "DCGM_FI_DEV_POWER_USAGE": s.power_w,
                "gpushepherd_gpu_utilization_ratio": s.util_pct / 100 if s.util_pct is not None else None,
                "gpushepherd_gpu_memory_used_bytes": s.mem_used_mib * MIB if s.mem_used_mib is not None else None,
                "gpushepherd_gpu_memory_total_bytes": total * MIB if total is not None else None,
                "gpushepherd_gpu_temperature_celsius": s.temperature_c, "gpushepherd_gpu_power_watts": s.power_w}
            for name, value in values.items():
                if value is not None:
                    rows[name].append((ld if name.startswith("DCGM_") else lo, value))
        for name, doc in names:
            if name.startswith("DCGM_") and not with_dcgm:
                continue  # only with --dcgm-names: no duplicate of dcgm-exporter's series (note 019)
            yield _gauge(name, doc, dcgm if name.startswith("DCGM_") else ours, rows[name])
        yield _gauge("gpushepherd_gpu_unmanaged", "1 while a GPU runs processes gpushepherd did not start (not "
                     "handed out).", ours, unmanaged)


class ResponseCount:
    """ASGI middleware: counts each HTTP response in ``metrics.http`` by route template
    and status class; an exception out of the app is logged with the request's method and
    route and its traceback (``gpushepherd.daemon`` logger), counted as 5xx and raised on
    (Starlette answers it 500)."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = []

        async def sent(msg):
            if msg["type"] == "http.response.start":
                status.append(int(msg["status"]))
            await send(msg)

        try:
            await self.app(scope, receive, sent)
        except Exception:
            log.exception("API request %s %s failed (answered 500)", scope.get("method", "?"), route_of(scope))
            self.metrics.child(self.metrics.http, route_of(scope), "5xx").inc()
            raise
        code = status[0] if status else 500
        self.metrics.child(self.metrics.http, route_of(scope), f"{code // 100}xx").inc()


def route_of(scope) -> str:
    """The route template a request matched (``/jobs/{job_id}``), ``unmatched`` when none:
    a bounded label value, never the path."""
    route = scope.get("route")
    return getattr(route, "path", None) or "unmatched"


def pending_since(job) -> float:
    """When a pending job last became pending, seconds on the core's axis: its last
    transition to ``PENDING`` (its submission, or a requeue after a preemption or a lost
    run), else its submission time."""
    for h in reversed(job.history):
        if getattr(h.to_state, "value", h.to_state) == JobState.PENDING.value:
            return h.t
    return job.spec.submit_time


def _gauge(name: str, doc: str, labels: list[str], rows: Iterable[tuple[tuple, float]]) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(name, doc, labels=labels)
    for values, v in rows:
        fam.add_metric(list(values), float(v))
    return fam

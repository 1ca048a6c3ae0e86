"""The reconcile loop of ``shepherd server`` (design note 008).

One thread owns the core. Each step it collects process exits, due SIGKILLs, API
submissions and cancels, and a due tick (``Scheduler.next_wakeup``); commits them to
the event log as one batch; feeds them to the core; applies the decisions through the
backend (``gpushepherd.backends.Backend``: local processes or Slurm, note 013). It is the only place that reads the clock: seconds since the epoch,
never going back.

At start the core is rebuilt by replaying the log, then reconciled with the processes
an earlier server started (re-attached, launched, killed or recorded as lost).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpushepherd import __version__
from gpushepherd.backends import Backend, BackendError, make_backend, node_mismatches as engine_mismatches
from gpushepherd.core.amend import update_error
from gpushepherd.core.scheduler import Scheduler, SpecError, validate_spec
from gpushepherd.core.state import Transition
from gpushepherd.daemon.arrays import (
    MAX_LIVE_TASKS,
    MAX_TASKS_PER_STEP,
    ArrayRec,
    check_array,
    child_id,
    parse_child_id,
)
from gpushepherd.daemon.deps import (
    BAD,
    Kept,
    fmt_time,
    kept_from_dict,
    kept_reason,
    kept_to_dict,
    parse_begin,
    parse_dependency,
)
from gpushepherd.daemon.auth import NO_TOKEN
from gpushepherd.daemon.local import exit_status, mig_uuid
from gpushepherd.daemon.metrics import Metrics
from gpushepherd.gpu import InventoryError, JobDevices, open_inventory, procs
from gpushepherd.gpu.inventory import foreign_processes, node_mismatches
from gpushepherd.daemon.policy_change import Conflict, PolicyConflict, conflicts, never_start
from gpushepherd.daemon.services import Services
from gpushepherd.daemon.ratelog import RateLog
from gpushepherd.daemon.store import (
    DAEMON_EVENTS,
    JobKept,
    LaunchFailed,
    LockHeld,
    RunEnded,
    RunLost,
    StorageUnavailable,
    Store,
    audit_command,
    audit_row,
    local_who,
    spec_from_dict,
    spec_to_dict,
    storage_reason,
)
from gpushepherd.model.access import class_refusal
from gpushepherd.model.decisions import Decision, Preempt, ReconfigureMig, Reject, Start, Stop
from gpushepherd.model.events import (
    Event,
    GpuUnmanaged,
    JobCancelled,
    JobFinished,
    JobRequeueRequested,
    JobSubmitted,
    JobUpdated,
    Tick,
    UsageSample,
)
from gpushepherd.model.job import ExitStatus, JobSpec, JobState, natural_key
from gpushepherd.model.placement import Placement
from gpushepherd.policy.load import Policy, policy_from_dict, read_policy_dict

log = logging.getLogger("gpushepherd.daemon")

HEARTBEAT_S = 5.0
#: the longest back-off before a lost run is handed to the core (seconds)
MAX_REQUEUE_BACKOFF_S = 300.0
#: the longest wait between two attempts of a step that failed (seconds)
MAX_FAILED_STEP_WAIT_S = 5.0
#: a snapshot after this many batches, or this many seconds with at least one batch (note 017)
SNAPSHOT_EVERY_BATCHES = 2000
SNAPSHOT_EVERY_S = 300.0
#: the format of a snapshot's payload
SNAPSHOT_FORMAT = 1
#: archived job records kept in memory for views
ARCHIVE_CACHE = 4096
#: ended jobs archived per loop iteration at most (the rest at the next ones)
ARCHIVE_CHUNK = 2000
#: the final states of a job (the jobs table's state column)
TERMINAL_STATES = tuple(s.value for s in JobState if s.terminal)
#: idempotency keys kept in memory (the database keeps them all for IDEMPOTENCY_TTL_S)
IDEMPOTENCY_CACHE = 10_000
#: seconds an idempotency key is kept (Stripe's 24 h)
IDEMPOTENCY_TTL_S = 86400.0
#: ``/readyz``: seconds since the loop's last completed step after which the server is not
#: ready (``--ready-max-step-age``; the loop steps every ``poll_s`` when idle; note 019)
READY_MAX_STEP_AGE_S = 30.0


class HeldLog(logging.Handler):
    """Holds the records of the ``gpushepherd`` loggers, from any thread, between
    ``hold()`` and ``hand_on(first)``: then ``first`` is logged, then the held records
    in their order, then whatever comes next (note 019: the server's first line says
    where it listens and which policy runs, though the start logs before it knows).
    Several at once (daemons started together in one process) each hold their own; the
    ``gpushepherd`` logger propagates again when the last one hands on."""

    _lock = threading.Lock()
    _holders = 0  # HeldLogs holding now
    _was = True  # the logger's propagate before the first of them

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] | None = None
        self._logger = logging.getLogger("gpushepherd")

    def emit(self, record: logging.LogRecord) -> None:  # called under self.lock
        # the first HeldLog still holding keeps it: a record is held once, however many hold
        first = next((h for h in self._logger.handlers if isinstance(h, HeldLog) and h.records is not None), None)
        if first is self and self.records is not None:
            self.records.append(record)

    def hold(self) -> None:
        self.records = []
        with HeldLog._lock:
            if HeldLog._holders == 0:
                HeldLog._was = self._logger.propagate
            HeldLog._holders += 1
            self._logger.addHandler(self)
            self._logger.propagate = False

    def hand_on(self, first: str | None = None) -> None:
        """Log ``first`` (``None``: nothing) and the held records. Under the handler's
        lock: a record another thread logs meanwhile waits here, and is then handed on
        once, after them."""
        self.acquire()
        try:
            held, self.records = self.records or [], None
            with HeldLog._lock:
                HeldLog._holders -= 1
                if HeldLog._holders == 0:
                    self._logger.propagate = HeldLog._was
            if first is not None:
                log.info("%s", first)
            for record in held:
                logging.getLogger(record.name).handle(record)
        finally:
            self.release()
        self._logger.removeHandler(self)


class DaemonError(RuntimeError):
    """The server cannot start; ``str()`` says why and what to do."""


def audit_outcome(exc: BaseException | None) -> str:
    """The ``outcome`` of an audit row for a command that raised ``exc``: ``ok`` (none),
    ``failed`` (storage, time-out: it may not be applied), else ``refused``."""
    if exc is None:
        return "ok"
    return "failed" if isinstance(exc, (StorageUnavailable, TimeoutError)) else "refused"



class Command(Future):
    """The future of an API command to the loop, carrying ``who`` asked for it (``{"user",
    "token_id", "uid", "address"}``; ``None``: not audited, e.g. an engine's own cancel):
    the loop writes the command's audit row (note 023) in the transaction of the command."""

    def __init__(self, who: dict | None = None, open_check: bool = False, aio: tuple | None = None):
        super().__init__()
        self.who = who
        #: sent without a token to a server that was open at the API's last look: the step
        #: confirms that no token exists now before taking it (note 032)
        self.open_check = open_check
        #: ``(event loop, asyncio future)`` the API awaits: settled with this future, by a
        #: call on that loop - one call for all the answers of a step (``answer_all``, note 032)
        self.aio = aio

    def set_result(self, result: Any) -> None:
        super().set_result(result)
        self._settle_aio([(self, result, None)])

    def set_exception(self, exception: BaseException | None) -> None:
        super().set_exception(exception)
        self._settle_aio([(self, None, exception)])

    def _settle_aio(self, items: list[tuple]) -> None:
        if self.aio is not None and not self.aio[0].is_closed():
            try:
                self.aio[0].call_soon_threadsafe(_settle, [(c.aio[1], result, exc) for c, result, exc in items])
            except RuntimeError:  # the loop closed meanwhile (the server stopping): nobody awaits them
                pass


def _settle(items: list[tuple]) -> None:
    """On the event loop: ``(asyncio future, result, exception)`` each; a future the
    API gave up on (its timeout cancelled it) is left alone."""
    for afut, result, exc in items:
        if not afut.done():
            if exc is not None:
                afut.set_exception(exc)
            else:
                afut.set_result(result)


def answer_all(answers: list[tuple[Future, Any]]) -> None:
    """Set the result of each ``(future, value)``; the asyncio futures of ``Command``s
    (``Command.aio``) are settled by one call per event loop, not one per answer: each
    call wakes the loop, which then takes the GIL from the thread still answering
    (note 032)."""
    by_loop: dict[Any, list[tuple]] = {}
    for fut, value in answers:
        aio = getattr(fut, "aio", None)
        if aio is None:
            fut.set_result(value)
            continue
        Future.set_result(fut, value)  # the concurrent future alone; its asyncio one below
        by_loop.setdefault(aio[0], []).append((fut, value, None))
    for items in by_loop.values():
        items[0][0]._settle_aio(items)


class TokenRequired(PermissionError):
    """A command sent without a token as to an open server (``Command.open_check``), taken
    by a step after a token was created (by any process): refused, nothing of it applied,
    no audit row - the API's 401, as if the token had been seen on arrival (note 032)."""


class IdempotencyConflict(ValueError):
    """An ``Idempotency-Key`` already used by this caller for another request body (the
    IETF draft's 422); ``job_id`` is the job the first request made."""

    def __init__(self, key: str, job_id: str):
        self.key, self.job_id = key, job_id
        super().__init__(f"Idempotency-Key: {key!r} is not allowed: it was used for another request (job {job_id}); "
                         "use a new key for a new submission")


class JobActionRefused(ValueError):
    """A hold, release, update or requeue that does not apply to the job in its state
    (the API's 409); ``str()`` says why and what works instead (note 021)."""


#: the usage fields of a job view that has never run (a kept job, note 021)
NO_USAGE = {"gpu_util_pct": None, "gpu_mem_mib": None, "sampled_at": None, "peak_gpu_mem_mib": None,
            "declared_gpu_mem_mib": None, "over_declared_mem": False, "idle_since": None, "idle_stop_at": None,
            "stop_reason": None}
def constraints_view(spec: JobSpec) -> dict[str, Any]:
    """A job's placement constraints and deadline as ``GET /jobs/{id}`` shows them (note
    022): ``node_selector`` as ``["zone=a", "nvlink"]`` (a Slurm feature without ``=``),
    ``tolerations``, ``min_driver``, ``cache_key``, ``cache_required``, ``deadline`` (epoch
    seconds or ``None``), ``gpus_per_pod``, ``same_node``, ``grace_period_s`` (``None``: the
    class's) and ``require_island`` (``None``: the class's); and its cgroup limits (note
    023): ``mem_mib`` (host memory, MiB) and ``cpus``, ``None`` when not set."""
    return {"node_selector": [f"{k}={v}" if v else k for k, v in spec.node_selector],
            "tolerations": list(spec.tolerations), "min_driver": spec.min_driver, "cache_key": spec.cache_key,
            "cache_required": spec.cache_required, "deadline": spec.deadline, "gpus_per_pod": spec.gpus_per_pod,
            "same_node": spec.same_node, "grace_period_s": spec.grace_period_s, "mem_mib": spec.mem_mib or None,
            "cpus": spec.cpus or None, "require_island": spec.require_island}


class Daemon:
    """The server's state and its reconcile loop.

    Args:
        data_dir: logs, checkpoints, exit files, and the SQLite database by default.
        db_url: a SQLAlchemy URL (default: SQLite in ``data_dir``).
        policy_path: the policy file; ``None``: the last policy in the event log.
        poll_s: seconds between loop steps when nothing wakes it (process exits are
            polled).
        inventory: ``auto``, ``nvml`` or ``static`` (``gpushepherd.gpu.open_inventory``);
            ``static`` by default here, so that an embedding program or test sees the
            same GPUs on any machine (``shepherd server`` defaults to ``auto``).
        sample_every: seconds between GPU samples.
        node: the policy's node this server is; ``None``: the policy's only node.
        clock: the loop's only clock, seconds since the epoch (default ``time.time``;
            tests pass a shifted one to cross a window boundary).
        idle_threshold_pct, idle_after_s: allocated-but-idle GPUs in ``/metrics`` for
            classes without ``idle_stop`` (note 011): utilisation below this percent for
            this many seconds.
        backend: where jobs run: ``local`` (process groups here), ``slurm`` (note 013;
            the Slurm commands read ``SLURM_CONF``) or ``ray`` (note 013, "Ray").
        slurm_partition: the Slurm partition gpushepherd owns.
        ray_address: the Ray cluster's address (``auto``, ``HOST:PORT``).
        k8s: ``KubernetesBackend``'s options (``--backend kubernetes``, note 016).
        max_requeues: how many lost runs of one job (ended without an exit code: the
            runner or the machine gone) are requeued; the next one fails the job
            (Slurm's requeue limit; note 017).
        requeue_backoff_s: seconds before the first lost run is requeued; doubled for
            each further one, at most ``MAX_REQUEUE_BACKOFF_S``.
        busy_timeout_s: SQLite's busy timeout (``Store``), seconds.
        scrape_allow: networks (CIDR) and host names a service's ``metrics_url`` may
            point to besides loopback and its replicas' nodes (note 017).
        ready_max_step_age_s: ``/readyz`` fails once the loop has completed no step for
            this many seconds (note 019).
        dcgm_names: ``/metrics`` also exports the GPU samples under DCGM-exporter's
            ``DCGM_FI_DEV_*`` names (note 019; off: a node running dcgm-exporter too
            gets no duplicate series).

    Raises:
        ValueError: an idle threshold outside 0-100 or a non-positive idle time; an
            unknown ``backend``; a negative ``max_requeues`` or ``requeue_backoff_s``; a
            ``ready_max_step_age_s`` that is not a finite number > 0.
    """

    def __init__(self, data_dir: Path, db_url: str | None = None, policy_path: Path | None = None,
                 poll_s: float = 0.2, inventory: str = "static", sample_every: float = 10.0, node: str | None = None,
                 clock=time.time, idle_threshold_pct: float = 5.0, idle_after_s: float = 600.0,
                 backend: str = "local", slurm_partition: str = "shepherd", ray_address: str = "auto",
                 k8s: dict | None = None, max_requeues: int = 3, requeue_backoff_s: float = 2.0, busy_timeout_s: float = 30.0,
                 scrape_allow: list[str] | None = None, ready_max_step_age_s: float = READY_MAX_STEP_AGE_S,
                 dcgm_names: bool = False):
        if not 0 < ready_max_step_age_s < float("inf"):
            raise ValueError(f"ready_max_step_age_s: {ready_max_step_age_s!r} is not allowed: seconds > 0, finite")
        if max_requeues < 0:
            raise ValueError(f"max_requeues: {max_requeues!r} is not allowed: 0 or more")
        if not 0 <= requeue_backoff_s <= MAX_REQUEUE_BACKOFF_S:
            raise ValueError(f"requeue_backoff_s: {requeue_backoff_s!r} is not allowed: 0..{MAX_REQUEUE_BACKOFF_S:g} s")
        self.data_dir = Path(data_dir).resolve()
        if db_url is None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._private_db()
        # a --db that fails leaves no folder
        self.store = Store(db_url or Store.sqlite_url(self.data_dir), busy_timeout_s=busy_timeout_s)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.backend: Backend = make_backend(backend, self.data_dir, partition=slurm_partition,
                                             ray_address=ray_address, k8s=k8s)
        if self.backend.kind == "local":  # jobs of other users reach their files through it (note 023)
            mode = 0o711 if self.backend.run_as.per_user else 0o700
            try:
                os.chmod(self.data_dir, mode)
            except PermissionError as exc:
                log.warning("data dir %s: cannot make it mode %o (%s): other local users may list it", self.data_dir,
                            mode, exc.strerror)
        self.policy_path = policy_path
        self.poll_s = poll_s
        self.clock = clock
        self.lock = threading.RLock()  # held by the loop while it changes the core; by readers
        self.commands: queue.Queue = queue.Queue()
        self.wake = threading.Event()
        self.sched: Scheduler | None = None
        self.rules = None
        self.placements: dict[str, Placement] = {}  # last Start of each job
        self.runs: Counter = Counter()  # Start decisions per job (run numbers)
        self.kills: dict[str, tuple[int, float]] = {}  # job -> (run, SIGKILL due): a kill belongs to one run
        self.live_run: dict[str, int] = {}  # job -> the run whose process the backend tracks
        # job -> its run that had ended on its own when its preemption signal was due (the
        # exit came before the signal: it ends as its code says; note 048)
        self.ended_unsignalled: dict[str, int] = {}
        self.deferred: list[Event] = []  # events found while reconciling, fed in the next step
        # lost runs (note 017): the logged RunLost events of each job, and the runs to hand to
        # the core once their back-off is over: job -> (run, due)
        self.max_requeues, self.requeue_backoff_s = max_requeues, requeue_backoff_s
        self.lost: dict[str, list[RunLost]] = {}
        self._lost_due: dict[str, tuple[int, float]] = {}
        # kept until committed (note 017): exits reported by the backend (job -> code, None:
        # lost), runs waiting for their attempt to be committed before the fork, pids to write
        self._exits: dict[str, int | None] = {}
        self._launches: list[tuple[str, int, Placement, dict]] = []
        self._pending_rows: dict[str, dict[str, Any]] = {}
        self._fail_wait = 0.0  # seconds to wait before the next step after a failed one
        self._idem: dict[tuple[str, str], tuple[str, str]] = {}  # (scope, key) -> (body hash, job id)
        # snapshots (note 017): the last batch the newest one covers, when it was taken,
        # whether one is due now; archived records read for views (job -> record)
        self._snap_batch, self._snap_t, self._snapshot_due = 0, 0.0, False
        self._archive: dict[str, dict] = {}
        self.ratelog = RateLog(log)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._dir_lock: int | None = None  # descriptor holding the data dir's flock
        self._beat = 0.0
        self.next_num = 1
        #: job -> why its last launch failed (E2BIG, ...): this server's life only, not logged
        self.launch_errors: dict[str, str] = {}
        #: job -> (run, reason, detail) of a run that ended for a reason its exit code does not
        #: say (``OUT_OF_MEMORY``; logged as ``RunEnded``, note 023)
        self.end_reasons: dict[str, tuple[int, str, str]] = {}
        #: audit rows of the API's own (403s, token uses), committed with the next step (note 023)
        self._audit_later: list[dict] = []
        self._audit_lock = threading.Lock()
        self.arrays: dict[str, ArrayRec] = {}  # job arrays by id (gpushepherd.daemon.arrays)
        # jobs kept from the core (dependency, begin time, hold; note 021): committed records,
        # this step's changes (None: handed to the core), why the policy refuses one now,
        # and the (name, user) pairs of the core's jobs not ended (singleton; None: not read)
        self.kept: dict[str, Kept] = {}
        self._kept_staged: dict[str, Kept | None] = {}
        self._kept_bad: dict[str, str] = {}
        self._busy: set[tuple[str, str]] | None = None
        #: job -> final state of the jobs that ended before this server's snapshot (note 017)
        self.ended_states: dict[str, str] = {}
        self.scrape_allow = list(scrape_allow or [])
        self.services = Services(self)  # inference services (gpushepherd.daemon.services, note 014)
        # GPU inventory and samples (note 008): live state, not stored (the flags and
        # peaks the core was told are rebuilt from the log)
        self.inventory_kind, self.sample_every, self.node_name = inventory, sample_every, node
        self.inventory = None
        self.node = None  # the policy's Node this server is
        self.found = None  # its Discovery
        self.gpu_samples: dict[int, Any] = {}  # GPU index -> last GpuSample
        #: the daemon's own copy of each job's samples: last utilisation and memory, peak memory
        self.sampled: dict[str, dict[str, Any]] = {}
        self.unmanaged: dict[int, list[dict]] = {}  # GPU index -> foreign processes (pid, owner, command, MiB)
        self.unmanaged_flag: dict[tuple[str, int], bool] = {}  # as last logged (GpuUnmanaged)
        self._logged_active: dict[str, bool] = {}  # job -> active in its last logged sample (this server's life)
        self._last_pids: frozenset[int] = frozenset()
        self._next_sample = 0.0
        self.policies: list[dict] = []  # the logged policies: version, t, by, source, policy
        self.policy_queue: queue.Queue = queue.Queue()  # policy applies, taken at the top of a step
        self.metrics = Metrics(self, idle_threshold_pct, idle_after_s,
                               stderr_of=lambda j: self.backend.run_dir(j, self.runs[j]) / "stderr",
                               dcgm_names=dcgm_names)
        # the loop's health (note 019): monotonic seconds of the last completed step and of
        # the one running now (None: none), epoch seconds of the last completed one (or of
        # the start, before the first), and the last failed step: (monotonic seconds, why)
        self.ready_max_step_age_s = ready_max_step_age_s
        self.last_step_mono: float | None = None
        self.step_started_mono: float | None = None
        self.last_step_wall = time.time()
        self.last_step_error: tuple[float, str] | None = None

    # ------------------------------------------------------------ start / stop
    def start(self, listen: str | None = None, prepare: Callable[[], None] | None = None) -> None:
        """Take the database lock, rebuild the core from the log, reconcile processes
        and start the loop thread. The first line it logs is ``startup_line(listen)``
        (``listen``: where the API is served, ``http://HOST:PORT``): the lines the start
        writes before it knows the policy in force are held until then (``HeldLog``).
        ``prepare``: called once both locks are held and before ``--policy`` is taken or
        anything logged (the CLI binds the Unix socket there, note 084); what it raises
        refuses the start, the locks released and nothing written.

        Raises:
            LockHeld: another server holds the database or the data directory.
            DaemonError: no policy given and none logged; ``--policy`` conflicts with
                live jobs.
            PolicyError: the policy file is invalid.
        """
        now = self.clock()
        held = HeldLog()
        held.hold()
        try:
            self._start(now, prepare)
        except BaseException:
            held.hand_on()
            raise
        held.hand_on(self.startup_line(listen))

    def startup_line(self, listen: str | None = None) -> str:
        """The server's first log line (note 019): version, where it listens
        (``listen``), the policy in force (version, source, when and by whom it was
        applied), data dir, database, backend."""
        cur = self.policy_view(with_policy=False) if self.policies else {}
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(cur["t"])) if cur.get("t") is not None else "?"
        where = f"serving {listen}" if listen else "started (no HTTP listener of its own)"
        runs = f"; {self.backend.run_as.text()}" if self.backend.kind == "local" else ""
        return (f"gpushepherd {__version__} {where}; policy version {cur.get('version', '?')} from "
                f"{cur.get('source') or '?'} (applied {when} by {cur.get('by') or '?'}); data dir {self.data_dir}, "
                f"database {self.store.display_url}, backend {self.backend.kind}, pid {os.getpid()}{runs}")

    def _start(self, now: float, prepare: Callable[[], None] | None = None) -> None:
        self._lock_data_dir()
        try:
            self.store.acquire_lock(now)
        except BaseException:
            self._unlock_data_dir()
            raise
        self._beat = now
        try:
            if prepare is not None:
                prepare()
            self._load_policy(now)
            if self.backend.kind == "local":  # note 023: as whom jobs run, and how they are contained
                log.info("jobs: %s", self.backend.describe())
                # a pty job without a client past the grace: its session ended (note 041)
                self.backend.on_detached = lambda job_id, _run: self.cancel(job_id, who=None)
            self._open_inventory()
            self.next_num = self.store.next_job_number()
            self.store.idempotency_prune(now - IDEMPOTENCY_TTL_S)
            self._load_arrays()
            self.services.load()
            self._reconcile()
            serve = getattr(self.backend, "serve", None)
            if serve is not None:  # an engine that feeds the server (Kubernetes' pod intake, note 016)
                serve(self)
        except BaseException:
            close = getattr(self.backend, "close", None)
            if close is not None:
                close()
            self.store.release_lock()
            self._unlock_data_dir()
            raise
        self._thread = threading.Thread(target=self._loop, name="shepherd-reconcile", daemon=True)
        self._thread.start()
        self.services.start()

    def stop(self) -> None:
        """Stop the loop and release the lock. Jobs keep running: a restarted server
        re-attaches to them."""
        self.services.stop()
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()
        self._stop.set()
        self.wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            with self.lock:  # the next start reads this instead of the log since the last one
                rows = self._take_audit_later()
                if rows:
                    try:
                        self.store.write_audit(rows)
                    except Exception as exc:
                        log.error("%d audit rows not written at stop: %s", len(rows), storage_reason(exc) or exc)
                if self.store.last_batch != self._snap_batch or self._snapshot_due:
                    for _ in range(len(self.sched.jobs) // ARCHIVE_CHUNK + 2):
                        if self.take_snapshot(max(self.clock(), self.sched.now)):
                            break
        after_stop = getattr(self.backend, "after_stop", None)
        if after_stop is not None and (self._thread is None or not self._thread.is_alive()):
            after_stop()  # nothing launches any more (the local backend's empty cgroups go)
        self.store.release_lock()
        self.store.close()
        self._unlock_data_dir()
        if self.inventory is not None:
            self.inventory.close()
        log.info("stopped: state saved, data dir unlocked (running jobs keep running; a restart re-attaches)")

    def _lock_data_dir(self) -> None:
        """Hold an exclusive ``flock`` on ``<data_dir>/server.lock`` for the server's
        life (the OS drops it when the process dies, ``kill -9`` too): two servers on one
        data dir would write each other's run logs even with different databases.

        Raises:
            LockHeld: another server holds it (its pid, written in the file, named).
        """
        import fcntl

        path = self.data_dir / "server.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise LockHeld(f"data directory {self.data_dir}: another gpushepherd server holds it (pid {holder}, "
                           f"lock file {path}); stop that server first - only one server may use a data "
                           "directory") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._dir_lock = fd

    def _private_db(self) -> None:
        """Create the SQLite database file with mode 0600 before SQLite does (with the
        process's umask), so that it - and its ``-wal``/``-shm``, which take its mode - is
        the server's alone (note 023); an existing one is made 0600 too."""
        path = self.data_dir / "shepherd.db"
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            pass
        for p in (path, path.with_name("shepherd.db-wal"), path.with_name("shepherd.db-shm")):
            try:
                os.chmod(p, 0o600)
            except FileNotFoundError:
                pass

    def _unlock_data_dir(self) -> None:
        fd, self._dir_lock = self._dir_lock, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor drops the flock

    def _load_policy(self, now: float) -> None:
        """Replay the log, then take ``--policy``: checked against the replayed live
        jobs exactly as ``policy apply`` is (``check_policy``) BEFORE it is logged, so
        a refused file leaves the data dir as it was.

        Raises:
            DaemonError: no policy at all, or ``--policy`` conflicts with live jobs
                (each job and field named); nothing is logged.
            PolicyError: the policy file is invalid.
        """
        logged = self.store.last_policy()
        if self.policy_path is None:
            if logged is None:
                raise DaemonError(f"no policy: pass --policy FILE (the database {self.store.display_url} has none yet)")
            self._replay()
            return
        raw = read_policy_dict(self.policy_path)
        pol = policy_from_dict(raw, source=str(self.policy_path))  # refuse a bad file before logging it
        raw = json.loads(json.dumps(raw, default=str))

        def audit(version: int) -> list[dict]:  # note 023: the start's policy is audited too
            return [audit_row(now, "policy-apply", local_who("shepherd server --policy"), target=str(version),
                              detail={"source": str(self.policy_path)})]
        if logged is None:  # a new database: nothing to conflict with
            self.store.append_policy(now, raw, by="server --policy", source=str(self.policy_path),
                                     audit_rows=audit(1))
            self._replay()
            return
        self._replay()
        try:
            _pol, raw, new = self.check_policy(raw, str(self.policy_path))
        except PolicyConflict as exc:
            raise DaemonError(f"--policy {self.policy_path}: refused, nothing logged: {exc} (finish or cancel those "
                              "jobs first, or start without --policy to keep the logged one)") from None
        if new is None:
            return
        t = max(now, self.sched.now)
        self.store.append_policy(t, raw, by="server --policy", source=str(self.policy_path),
                                 audit_rows=audit(len(self.policies) + 1))
        self.sched, self.rules = new, pol.rules
        self.policies = self.store.policy_history()
        self._never_start_note(new)  # a warning in the server's log

    def _replay(self) -> None:
        """Rebuild the core: from the newest snapshot, if any, and the batches after it
        (note 017), else from the whole log (then a snapshot is taken once the server
        runs). A logged policy the live jobs cannot be restored under (logged by a
        server before ``--policy`` was checked) is skipped, with a warning and
        ``skipped`` (why) in its history entry: the policy before it stays in force, so
        such a data dir starts again."""
        sched = None
        skipped: dict[int, str] = {}  # policy version -> why
        version, after = 0, 0
        snap = self.store.last_snapshot()
        if snap is not None and snap[2].get("format") != SNAPSHOT_FORMAT:
            log.warning("the newest snapshot has format %r, not %d: replaying the whole log", snap[2].get("format"),
                        SNAPSHOT_FORMAT)
            snap = None
        if snap is not None:
            after, _t, payload = snap
            sched, version = self._from_snapshot(payload)
            skipped = {int(k): v for k, v in payload.get("skipped", {}).items()}
            self._snap_batch, self._snap_t = after, time.time()
            log.info("starting from the snapshot of batch %d (%d jobs not ended, %d archived); replaying the batches "
                     "after it", after, len(sched.jobs), len(self.ended_states))
        else:
            self._snapshot_due = True  # the next start reads a snapshot instead of this whole log
        for _t, kind, item in self.store.batches(daemon=True, after=after):
            if kind == "policy":
                version += 1
                rules = policy_from_dict(item, source="policy in the event log", intake=False).rules
                if sched is None:
                    sched, self.rules = Scheduler(rules), rules
                    continue
                # another policy (a restart with --policy, or policy apply): same state, new rules
                try:
                    sched, self.rules = self._restored(sched, rules), rules
                    continue
                except (ValueError, KeyError, AssertionError) as exc:
                    why = "; ".join(c.msg for c in conflicts(sched, self.rules, rules, self.placements,
                                                             self._kept_specs())) or \
                        f"the running jobs do not fit it: {exc!r}"
                skipped[version] = why
                log.warning("policy version %d in the event log is skipped (the one before stays in force): %s",
                            version, why)
                continue
            for e in item:
                self._note_sample(e)
                if isinstance(e, RunLost):
                    self.lost.setdefault(e.job_id, []).append(e)
                elif isinstance(e, LaunchFailed):
                    self.launch_errors[e.job_id] = e.error
                elif isinstance(e, RunEnded):
                    self.end_reasons[e.job_id] = (e.run, e.reason, e.detail)
                elif isinstance(e, JobKept):
                    self.kept[e.job_id] = kept_from_dict(e.data, spec_from_dict)
                elif isinstance(e, JobSubmitted) and e.spec.id in self.kept:
                    del self.kept[e.spec.id]  # handed to the core
            item = [e for e in item if not isinstance(e, DAEMON_EVENTS)]
            self.sched = sched
            decisions = sched.handle(item)
            for d in decisions:
                self._track(d)
            self.metrics.observe(sched.now, item, decisions)  # counters rebuilt from the log (note 011)
        self.sched = sched
        self._skipped = skipped
        self.policies = self.store.policy_history()
        for p in self.policies:
            if p["version"] in skipped:
                p["skipped"] = skipped[p["version"]]

    # ------------------------------------------------------------ snapshots (note 017)
    def _from_snapshot(self, payload: dict) -> tuple[Scheduler, int]:
        """The core and the daemon's state from a snapshot's ``payload``; returns the
        core and the policy version in force (the ended jobs' records stay in the
        database, their states are read)."""
        version = int(payload["policy_version"])
        history = self.store.policy_history()
        rules = policy_from_dict(history[version - 1]["policy"], source="policy in the event log", intake=False).rules
        self.rules = rules
        sched = Scheduler.restore(rules, payload["core"])
        for job_id, lines in payload["histories"].items():
            job = sched.jobs.get(job_id)
            if job is not None:
                job.history[:] = [Transition(float(t), a, b, r, int(ev)) for t, a, b, r, ev in lines]
        self.runs = Counter({j: int(n) for j, n in payload["runs"].items()})
        self.placements = {j: Placement(tuple((n, tuple(g)) for n, g in v["parts"]), v["share"])
                           for j, v in payload["placements"].items()}
        self.lost = {j: [RunLost(*r) for r in recs] for j, recs in payload["lost"].items()}
        for j, peak in payload["peaks"].items():
            self.sampled.setdefault(j, {"peak_gpu_mem_mib": 0})["peak_gpu_mem_mib"] = int(peak)
        self.unmanaged_flag = {(n, int(g)): bool(f) for n, g, f in payload["unmanaged"]}
        self.metrics.load(payload["metrics"])
        self.kept = {j: kept_from_dict(d, spec_from_dict) for j, d in payload.get("kept", {}).items()}
        self.end_reasons = {j: (int(r), why, detail) for j, (r, why, detail) in payload.get("end_reasons", {}).items()}
        self.ended_states = self.store.ended_states()
        return sched, version

    def _policy_version(self) -> int:
        """The version (1, 2, ...) of the policy in force."""
        return self._in_force()["version"]

    def take_snapshot(self, now: float) -> bool:
        """Write a snapshot of the core and the daemon's state covering every batch
        committed so far, with an ``ended_jobs`` row for each job that ended since the
        last one (called with ``self.lock`` held, between steps). When more than
        ``ARCHIVE_CHUNK`` ended jobs wait (the first snapshot of a long log), only that
        many are archived (committed) per call and the snapshot itself is written by a
        later call: the loop is never held for long. Never raises: a failed write is
        logged (once a minute) and retried later; returns whether the snapshot was
        written."""
        sched = self.sched
        try:
            live = {j for j, x in sched.jobs.items() if not x.state.terminal}
            ended = [j for j, x in sched.jobs.items() if x.state.terminal and j not in self.ended_states]
            if len(ended) > ARCHIVE_CHUNK:  # archive a chunk now, the rest (and the snapshot) next time
                chunk = ended[:ARCHIVE_CHUNK]
                self.store.archive_jobs([{"id": j, "state": sched.jobs[j].state.value,
                                          "record": json.dumps(self._record(sched.jobs[j]))} for j in chunk])
                for j in chunk:
                    self.ended_states[j] = sched.jobs[j].state.value
                self._snapshot_due = True
                return False
            payload = {
                "format": SNAPSHOT_FORMAT, "policy_version": self._policy_version(),
                "skipped": {str(k): v for k, v in getattr(self, "_skipped", {}).items()},
                "core": self.live_snapshot(sched),
                "histories": {j: self._history_rows(sched.jobs[j]) for j in live},
                "runs": {j: n for j, n in self.runs.items() if j in live},
                "placements": {j: {"parts": [[n, list(g)] for n, g in pl.parts], "share": pl.share}
                               for j, pl in self.placements.items() if j in live and sched.jobs[j].state.holds_gpus},
                "lost": {j: [[r.t, r.job_id, r.run, r.cause, r.final, r.reason] for r in recs]
                         for j, recs in self.lost.items() if j in live},
                "peaks": {j: rec.get("peak_gpu_mem_mib", 0) for j, rec in self.sampled.items() if j in live},
                "unmanaged": [[n, g, f] for (n, g), f in sorted(self.unmanaged_flag.items())],
                "metrics": self.metrics.state(),
                "kept": {j: kept_to_dict(k, spec_to_dict) for j, k in self.kept.items() if k.state == "PENDING"},
                "end_reasons": {j: list(r) for j, r in self.end_reasons.items() if j in live},
            }
            rows = [{"id": j, "state": sched.jobs[j].state.value, "record": json.dumps(self._record(sched.jobs[j]))}
                    for j in ended]
            # kept jobs cancelled before they reached the core: archived as ended jobs
            gone = [j for j, k in self.kept.items() if k.state != "PENDING"]
            rows += [{"id": j, "state": self.kept[j].state, "record": json.dumps(self._kept_record(self.kept[j]))}
                     for j in gone]
            batch = self.store.last_batch
            self.store.write_snapshot(batch, now, payload, rows)
            self.store.idempotency_prune(now - IDEMPOTENCY_TTL_S)
        except Exception as exc:
            self.ratelog.error(f"snapshot:{storage_reason(exc) or type(exc).__name__}", "snapshot not written: %s; "
                               "retried later", storage_reason(exc) or f"{type(exc).__name__}: {exc}")
            return False
        for j in ended:
            self.ended_states[j] = sched.jobs[j].state.value
        for j in gone:
            self.ended_states[j] = self.kept.pop(j).state
        self._snap_batch, self._snap_t, self._snapshot_due = batch, now, False
        log.info("snapshot of batch %d: %d jobs not ended, %d archived", batch, len(live), len(rows))
        return True

    def _maybe_snapshot(self, now: float) -> None:
        batches = self.store.last_batch - self._snap_batch
        if self._snapshot_due or batches >= SNAPSHOT_EVERY_BATCHES or (
                batches and now - self._snap_t >= SNAPSHOT_EVERY_S):
            self.take_snapshot(now)

    @staticmethod
    def _history_rows(job) -> list[list]:
        return [[h.t, str(getattr(h.from_state, "value", h.from_state)), str(getattr(h.to_state, "value", h.to_state)),
                 h.reason, h.event] for h in job.history]

    def _record(self, job) -> dict:
        """What stays of an ended job for its views once it is archived."""
        return {"spec": spec_to_dict(job.spec), "state": job.state.value, "history": self._history_rows(job),
                "first_start": job.first_start, "runs": self.runs[job.id], "preemptions": job.preemptions,
                "reason": str(job.reason) if job.state is JobState.REJECTED else None,
                "priority": self.sched.priority_factors(job.id)["priority"] if job.id in self.sched.jobs else None,
                "priority_factors": self.sched.priority_factors(job.id) if job.id in self.sched.jobs else None,
                "time_limit_s": job.time_limit_s,
                "usage": self._usage_view(job),
                "lost": [[r.t, r.job_id, r.run, r.cause, r.final, r.reason] for r in self.lost.get(job.id, ())],
                "launch_error": self.launch_errors.get(job.id),
                "deadline_at_risk": [list(f) for f in job.deadline_flags],
                "end_reason": self._end_reason(job.id)}

    @staticmethod
    def _kept_record(k: Kept) -> dict:
        """``_record`` of a kept job that ended without reaching the core (cancelled)."""
        return {"spec": spec_to_dict(k.spec), "state": k.state, "history": [[*h, 0] for h in k.history],
                "first_start": None, "runs": 0, "preemptions": 0, "reason": None, "priority": None,
                "usage": dict(NO_USAGE), "lost": [], "launch_error": None, "deadline_at_risk": [],
                "dependency": k.dependency or None, "begin_time": k.begin}

    def archived(self, job_id: str) -> dict | None:
        """The record of a job archived before this server started (``None``: not one)."""
        if job_id not in self.ended_states or job_id in self.sched.jobs:
            return None
        rec = self._archive.get(job_id)
        if rec is None:
            rec = self.store.ended_records([job_id]).get(job_id)
            if rec is None:
                return None
            if len(self._archive) >= ARCHIVE_CACHE:
                self._archive.pop(next(iter(self._archive)))
            self._archive[job_id] = rec
        return rec

    def job_team(self, job_id: str) -> str | None:
        """The team of a job or array, archived ones included; ``None``: no such job."""
        return self._spec_field(job_id, "team")

    def job_user(self, job_id: str) -> str | None:
        """The user of a job or array, archived and kept ones included; ``None``: no such job."""
        return self._spec_field(job_id, "user")

    def job_field(self, job_id: str, name: str) -> Any:
        """Field ``name`` (``user``, ``team``, ``name``, ...) of the spec of a job or array,
        archived and kept ones included; ``None``: no such job."""
        return self._spec_field(job_id, name)

    def _spec_field(self, job_id: str, name: str) -> Any:
        """Field ``name`` of the spec of a job or array (core, kept, archived); ``None``: no such job."""
        if job_id in self.arrays:
            return self.arrays[job_id].spec[name]
        job = self.sched.jobs.get(job_id)
        if job is not None:
            return getattr(job.spec, name)
        if job_id in self.kept:
            return getattr(self.kept[job_id].spec, name)
        rec = self.archived(job_id)
        return rec["spec"][name] if rec is not None else None

    @staticmethod
    def live_snapshot(sched: Scheduler) -> dict:
        """``sched.snapshot()`` of the jobs not ended only (ended jobs never change:
        they are carried over, or archived, as they are), as fresh JSON data. The core
        is given, for that call, a ``jobs`` dict without the ended ones - on the object
        that holds it (the scheduler, or core v2's ``book``): the core has no
        ``snapshot(live_only=True)`` yet (note 017)."""
        holder = getattr(sched, "book", sched)
        full = holder.jobs
        holder.jobs = {j: x for j, x in full.items() if not x.state.terminal}
        try:
            return json.loads(json.dumps(sched.snapshot()))
        finally:
            holder.jobs = full

    @classmethod
    def _restored(cls, sched: Scheduler, rules) -> Scheduler:
        """``sched``'s state under ``rules`` (``Scheduler.restore`` of its snapshot of the
        jobs not ended), each job keeping its history; ended jobs are carried over as
        they are (they hold nothing and stay visible), so the cost is linear in the jobs
        not ended (note 017).

        Raises:
            ValueError, KeyError: the allocations do not fit the new rules' nodes.
        """
        new = Scheduler.restore(rules, cls.live_snapshot(sched), new_rules=True)
        for job_id, job in new.jobs.items():
            job.history[:] = sched.jobs[job_id].history
        for job_id, job in sched.jobs.items():
            if job.state.terminal:
                new.jobs[job_id] = job
        return new

    def _note_sample(self, e: Event) -> None:
        """Keep what a logged sample told the core: a job's peak memory, a GPU's
        unmanaged flag."""
        if isinstance(e, UsageSample):
            rec = self.sampled.setdefault(e.job_id, {"peak_gpu_mem_mib": 0})
            rec["peak_gpu_mem_mib"] = max(rec["peak_gpu_mem_mib"], e.mem_used_mib)
        elif isinstance(e, GpuUnmanaged):
            self.unmanaged_flag[(e.node, e.gpu)] = e.unmanaged

    def _open_inventory(self) -> None:
        """Pick this server's node, open the inventory and, with NVML, refuse a node
        the machine does not match. Under an engine (Slurm) the policy's nodes must be
        the engine's instead, and there are no GPU samples (note 013)."""
        nodes = self.rules.nodes
        if self.backend.kind != "local":
            try:
                wrong = engine_mismatches(nodes, self.backend.discover())
            except BackendError as exc:
                raise DaemonError(f"--backend {self.backend.kind}: {exc}") from None
            if wrong:
                raise DaemonError(f"the policy does not describe the {self.backend.kind} cluster: " + "; ".join(wrong)
                                  + " (fix the policy's nodes, or the engine's)")
            return
        names = ", ".join(n.name for n in nodes[:5]) + (", ..." if len(nodes) > 5 else "")
        if self.node_name is None:
            if len(nodes) != 1 and self.inventory_kind != "nvml":
                # a cluster simulated on this machine (tests, benches): every node's jobs
                # run here; no GPU samples (they would not say which node's GPU)
                log.warning("the policy has %d nodes (%s) and no --node: running all of them on this machine as a "
                            "simulated cluster, without GPU samples", len(nodes), names)
                return
            if len(nodes) != 1:
                raise DaemonError(f"--node: the policy has {len(nodes)} nodes ({names}): name the one this server is"
                                  " (or --inventory static to run them all here as a simulated cluster)")
            self.node = nodes[0]
        else:
            self.node = next((n for n in nodes if n.name == self.node_name), None)
            if self.node is None:
                raise DaemonError(f"--node: {self.node_name!r} is not allowed: a node of the policy ({names})")
        try:
            self.inventory = open_inventory(self.inventory_kind, self.node, self.data_dir)
            self.found = self.inventory.discover()
        except InventoryError as exc:
            raise DaemonError(str(exc)) from None
        if self.found.source == "nvml":
            wrong = node_mismatches(self.node, self.found)
            if wrong:
                self.inventory.close()
                raise DaemonError("the policy does not describe this machine: " + "; ".join(wrong)
                                  + " (fix the policy's node, or run with --inventory static)")
        log.info("inventory %s: node %s, %d GPU(s)%s", self.found.source, self.node.name, len(self.found.gpus),
                 f", driver {self.found.driver}, CUDA {self.found.cuda}" if self.found.driver else "")
        self.backend.node, self.backend.found = self.node.name, self.found

    def _load_arrays(self) -> None:
        for r in self.store.array_rows():
            self.arrays[r["id"]] = ArrayRec(
                id=r["id"], num=r["num"], text=r["array"], indices=json.loads(r["indices"]), throttle=r["throttle"],
                max_retries=r["max_retries"], submit_time=r["submit_time"], spec=json.loads(r["spec"]),
                argv=json.loads(r["argv"]), shell=r["shell"], env=json.loads(r["env"]), cwd=r["cwd"],
                cancelled=r["cancelled"])
        for job_id in self.store.job_ids(containing="_"):  # array children only
            parsed = parse_child_id(job_id)
            if parsed and parsed[0] in self.arrays:
                self.arrays[parsed[0]].attempts.setdefault(parsed[1], []).append(job_id)
        for rec in self.arrays.values():
            for ids in rec.attempts.values():
                ids.sort(key=lambda j: parse_child_id(j)[2])
            rec.rebuild(self.job_state, self.job_started)
            rec.ended = rec.counts(self.job_state)["state"] in ("COMPLETED", "FAILED", "CANCELLED")

    def job_state(self, job_id: str) -> str | None:
        """The state of a job (``PENDING``, ``COMPLETED``, ...) as the core has it, or as
        archived when it ended before this server started (note 017); ``None``: unknown."""
        job = self.sched.jobs.get(job_id)
        if job is not None:
            return job.state.value
        if job_id in self.kept:
            return self.kept[job_id].state
        if job_id in self.arrays:  # an array as a whole (a dependency on it, note 021)
            return self._array_progress(self.arrays[job_id])["state"]
        return self.ended_states.get(job_id)

    def _track(self, d: Decision) -> None:
        if isinstance(d, Start):
            self.placements[d.job_id] = d.placement
            self.runs[d.job_id] += 1

    def _reconcile(self) -> None:
        """Make processes match the replayed core (the core is the truth)."""
        sched, backend = self.sched, self.backend
        # the rows that matter: jobs the core has not ended, and rows that do not say
        # ended (a process may live on) - never every row of a long history (note 017)
        rows = self.store.job_rows(not_in_states=TERMINAL_STATES)
        live = [j for j, x in sched.jobs.items() if not x.state.terminal and j not in rows]
        rows.update(self.store.job_rows(ids=live))
        for job_id, row in sorted(rows.items(), key=lambda kv: kv[1]["num"]):
            job = sched.jobs.get(job_id)
            if job is None:  # archived (ended before the snapshot): only its processes matter
                if job_id in self.ended_states and row["run"]:
                    proc = self._attach(job_id, row["run"], row)
                    if proc is not None and backend.running(job_id):
                        log.warning("job %s is %s but its processes live: killing them", job_id,
                                    self.ended_states[job_id])
                        backend.kill(job_id)
                    self.store.update_job(job_id, state=self.ended_states[job_id])
                continue
            if job.state.holds_gpus:
                run = self.runs[job_id]
                if row["run"] < run:  # decided, logged, but the server died before the fork
                    log.warning("job %s: run %d was never launched; launching it now", job_id, run)
                    self._launches.append((job_id, run, self.placements[job_id], row))
                    continue
                proc = self._attach(job_id, run, row)
                if proc is None:
                    log.warning("job %s: run %d is gone without an exit code: lost", job_id, run)
                    self._exits[job_id] = None  # fed as a lost run in the first step
                else:
                    self.live_run[job_id] = run
                    if row["kill_at"] is not None:
                        self.kills[job_id] = (run, row["kill_at"])
                    if row.get("pty") and job.state.value == "RUNNING":
                        # its terminal's master closed with the server that held it: the
                        # session ended, so the job ends (note 041)
                        log.warning("job %s: its terminal was lost with the previous server: cancelling it", job_id)
                        self.commands.put(("cancel", job_id, Command(None)))
            elif row["run"]:
                proc = self._attach(job_id, row["run"], row)
                if proc is not None and backend.running(job_id):
                    log.warning("job %s is %s but its processes live: killing them", job_id, job.state.value)
                    backend.kill(job_id)
            if row["state"] != job.state.value:
                self.store.update_job(job_id, state=job.state.value)
        for job_id, records in self.lost.items():  # lost runs logged, not yet handed to the core
            job = sched.jobs.get(job_id)
            last = records[-1]
            if job is not None and job.state.holds_gpus and self.runs[job_id] == last.run and not last.final:
                self._lost_due[job_id] = (last.run, last.t + self._backoff(len(records)))

    def _attach(self, job_id: str, run: int, row: dict):
        """``backend.attach`` of a run an earlier server started; the local backend also
        learns the GPUs it holds (note 023: handed on once nothing of it is left)."""
        if self.backend.kind == "local":
            return self.backend.attach(job_id, run, row["pid"], row["proc_start"],
                                       placement=self.placements.get(job_id))
        return self.backend.attach(job_id, run, row["pid"], row["proc_start"])

    def _backoff(self, k: int) -> float:
        """Seconds between the ``k``-th lost run of a job (1, 2, ...) and its requeue."""
        return min(self.requeue_backoff_s * 2 ** (k - 1), MAX_REQUEUE_BACKOFF_S)

    def _ended_already(self, job_id: str) -> bool:
        """Whether the backend reports the job's run ended (``False`` when it cannot tell:
        a signal then follows, and its exit is counted as one after the signal)."""
        try:
            return not self.backend.running(job_id)
        except Exception:  # an engine that cannot be asked now
            self.ratelog.exception(f"running:{job_id}", "job %s: cannot tell whether its run still runs", job_id)
            return False

    def _exit_of(self, job, code: int) -> ExitStatus:
        """The status of a run of ``job`` that exited with ``code`` (note 048): a run the
        scheduler signalled for preemption (``PREEMPTING``: class preemption, reclaim, a
        window closing with ``checkpoint-and-stop``) is requeued whatever its code - one
        that catches SIGTERM and exits 0 (``trap 'exit 0' TERM``) is ``PREEMPTED``, as
        Slurm's ``PreemptMode=REQUEUE`` and Kueue do -, unless it had already ended on its
        own when the signal was due (``ended_unsignalled``): then its code says
        (``exit_status``: 0 ``COMPLETED``, 85 ``PREEMPTED``, else ``FAILED``)."""
        status = exit_status(code)
        ended_first = self.ended_unsignalled.get(job.id) == self.runs[job.id]
        if job.state is JobState.PREEMPTING and status is ExitStatus.COMPLETED and not ended_first:
            return ExitStatus.PREEMPTED
        return status

    @staticmethod
    def _kill_why(job) -> str:
        """Why this server killed a job's run, for the log: the job's state and its last
        transition's reason (a cancel, a preemption's or time limit's grace period that
        ended, a requeue)."""
        if job is None:
            return "the job had ended"
        last = job.history[-1].reason if job.history else ""
        what = {JobState.CANCELLED: "cancelled", JobState.PREEMPTING: "preempted, its grace period ended",
                JobState.STOPPING: "stopped, its grace period ended", JobState.PENDING: "requeued"}.get(
                    job.state, job.state.value)
        return f"{what}" + (f" ({last})" if last else "")

    @staticmethod
    def _lost(job) -> Event:
        """The event that hands a lost run to the core (``t`` is set when fed): a requeue,
        or - the core was preempting or stopping it - the exit it waited for."""
        if job.state is JobState.PREEMPTING:
            return JobFinished(0.0, job.id, ExitStatus.PREEMPTED)
        if job.state is JobState.STOPPING:
            return JobFinished(0.0, job.id, ExitStatus.TIMEOUT)
        return JobRequeueRequested(0.0, job.id)

    def _lost_run(self, now: float, job, cause: str) -> tuple[list, RunLost | None]:
        """The events for a run of ``job`` that ended without an exit code, found at
        ``now``: ``(events for this batch, the RunLost to record once committed)``.

        A run the core was preempting or stopping was killed by its grace period's
        SIGKILL, as planned: its exit is fed at once and nothing is counted. Otherwise the
        run is lost (note 017): the k-th is logged and handed to the core after
        ``_backoff(k)``; the one past ``max_requeues`` fails the job at once, the reason
        in its ``RunLost``."""
        run = self.runs[job.id]
        if job.state is not JobState.RUNNING:
            return [replace(self._lost(job), t=now)], None
        records = self.lost.get(job.id, [])
        if records and records[-1].run == run:  # already logged (a restart during its back-off)
            return [], None
        k = len(records) + 1
        if k > self.max_requeues:
            reason = (f"lost {k} time{'s' * (k != 1)} (each run ended without an exit code): the requeue limit "
                      f"{self.max_requeues} is reached (--max-requeues); last: {cause}")
            rec = RunLost(now, job.id, run, cause, final=True, reason=reason)
            log.error("job %s failed: %s", job.id, reason)
            return [rec, JobFinished(now, job.id, ExitStatus.FAILED)], rec
        rec = RunLost(now, job.id, run, cause)
        log.warning("job %s: run %d lost (%s); requeued in %g s (%d of at most %d requeues)", job.id, run, cause,
                    self._backoff(k), k, self.max_requeues)
        return [rec], rec

    # ------------------------------------------------------------ the API's side
    def submit(self, spec: JobSpec, argv: list[str], *, shell: bool = False, env: dict[str, str] | None = None,
               cwd: str, array: tuple[str, list[int], int, int] | None = None, timeout: float = 60.0) -> str:
        """Submit a job (``spec.id`` and ``submit_time`` are assigned); returns its id
        once it is in the event log. With ``array`` (text, indices, throttle,
        max_retries): an array, whose record is committed before the id is returned;
        its chunks are submitted by the loop.

        Raises:
            SpecError: the policy refuses the spec (field, value, what is allowed).
            TimeoutError: the loop did not answer within ``timeout`` seconds.
        """
        return self.submit_view(spec, argv, shell=shell, env=env, cwd=cwd, array=array, timeout=timeout)["id"]

    def submit_view(self, spec: JobSpec, argv: list[str], *, shell: bool = False, env: dict[str, str] | None = None,
                    cwd: str, array: tuple[str, list[int], int, int] | None = None,
                    timeout: float = 60.0) -> dict[str, Any]:
        """``submit``, returning the job's view (``job_view``) as the core left it after
        the batch that took the submission: taken by the loop in that step, so the
        caller waits for no lock (note 008, "Submission throughput"). Raises as
        ``submit``."""
        return self.submit_future(spec, argv, shell=shell, env=env, cwd=cwd, array=array).result(timeout=timeout)

    def submit_future(self, spec: JobSpec, argv: list[str], *, shell: bool = False,
                      env: dict[str, str] | None = None, cwd: str,
                      array: tuple[str, list[int], int, int] | None = None,
                      idempotency: tuple[str, str, str] | None = None, defer: dict | None = None,
                      who: dict | None = None, pty: bool = False, open_check: bool = False,
                      aio: tuple | None = None) -> Future:
        """Queue a submission for the loop and return at once: the future gets
        ``submit_view``'s result or its ``SpecError`` when the loop step that took it
        ends. ``aio``: ``(event loop, asyncio future)`` settled with it, on that loop (the
        API awaits that one, without a thread; ``Command.aio``).
        Never cancel it: the loop sets its result.

        ``idempotency``: ``(scope, key, body hash)`` of an ``Idempotency-Key`` (note
        017): a key already committed for ``scope`` with the same hash makes the result
        ``("replayed", view)`` of the job it made, with another hash an
        ``IdempotencyConflict``; a new key is committed with the submission.

        ``defer``: ``{"dependency": TEXT, "begin": VALUE, "held": BOOL}`` (note 021): the
        job is kept from the core until they hold; an unknown job id in the dependency or
        a ``singleton`` without a name is a ``SpecError``.

        ``who``: who submits (``Command.who``): its audit row (note 023) is committed with
        the submission, or - refused - on its own.

        ``pty``: the job runs on a pseudo-terminal a client attaches to (note 041; the
        local backend only, never an array: a ``SpecError`` otherwise).

        ``open_check``: sent without a token to a server that had no token at the API's
        last look (note 032): the step that takes it reads the tokens' version once for
        all such commands, after they were queued, and refuses them with
        ``TokenRequired`` when a token exists by then."""
        fut: Future = Command(who, open_check, aio)
        self.commands.put(("submit", (spec, list(argv), shell, dict(env or {}), cwd, array, idempotency, defer, pty),
                           fut))
        if not self.wake.is_set():  # queued first: a step after any clear of it takes the command
            self.wake.set()
        return fut

    def cancel(self, job_id: str, timeout: float = 60.0, who: dict | None = None) -> str:
        """Cancel a job; returns its state after the cancel is applied (``who``: audited
        as its canceller, ``Command.who``).

        Raises:
            KeyError: no such job.
        """
        fut: Future = Command(who)
        self.commands.put(("cancel", job_id, fut))
        self.wake.set()
        return fut.result(timeout=timeout)

    def job_action(self, kind: str, job_id: str, changes: dict | None = None, timeout: float = 60.0,
                   who: dict | None = None, admin: bool = True) -> dict:
        """``hold``, ``release``, ``update`` (``changes``: ``time_limit_s``, ``nice``,
        ``name``, ``begin``) or ``requeue`` a job in the loop (note 021); returns its view
        after. ``admin``: asked by an admin, who may raise a time limit and lower a nice
        (note 039).

        Raises:
            KeyError: no such job.
            JobActionRefused: not possible in the job's state (why, and what works).
            SpecError: an update the policy refuses (field, value, what is allowed).
            TimeoutError: the loop did not answer within ``timeout`` seconds.

        ``who``: audited as who asked (``Command.who``).
        """
        fut: Future = Command(who)
        self.commands.put((kind, (job_id, dict(changes or {}), admin), fut))
        self.wake.set()
        return fut.result(timeout=timeout)

    def check_policy(self, raw: Any, source: str, pol: Policy | None = None) -> tuple[Policy, Any, Scheduler | None]:
        """Whether the parsed YAML ``raw`` could replace the policy in force now (called
        with ``self.lock`` held; changes nothing). Returns the policy, ``raw`` as JSON
        and the core under it (``None``: identical to the policy in force). ``pol``:
        ``raw`` already validated (the API does it outside the lock, note 017).

        Raises:
            PolicyError: the policy is invalid (field, value, what is allowed).
            PolicyConflict: live jobs it would break (each job and field), or whose
                allocations do not fit it.
        """
        raw = json.loads(json.dumps(raw, default=str))
        if pol is None:
            pol = policy_from_dict(raw, source=source or "<policy>")
        if self.policies and raw == self._in_force()["policy"]:
            return pol, raw, None
        found = conflicts(self.sched, self.rules, pol.rules, self.placements, self._kept_specs())
        if found:
            raise PolicyConflict(found)
        try:
            new = self._restored(self.sched, pol.rules)
        except (ValueError, KeyError, AssertionError) as exc:
            raise PolicyConflict([Conflict("", "policy", f"the running jobs do not fit the new policy: {exc}")]) \
                from None
        return pol, raw, new

    def apply_policy(self, raw: Any, source: str = "", by: str = "", timeout: float = 60.0,
                     pol: Policy | None = None, who: dict | None = None) -> dict:
        """Apply a policy in the loop, atomically (see ``check_policy``): logged as the
        next version, then the core restored under it; jobs it now admits start in
        the same step. Returns ``policy_view``'s fields plus ``applied`` (``False``:
        identical to the version in force, nothing logged) and ``message``.

        Raises:
            PolicyError, PolicyConflict: as ``check_policy``; nothing is applied.
            TimeoutError: the loop did not answer within ``timeout`` seconds.

        ``who``: audited as who applied it (note 023), in the policy's own transaction.
        """
        fut: Future = Command(who)
        self.policy_queue.put((raw, source, by, pol, fut))
        self.wake.set()
        return fut.result(timeout=timeout)

    def _apply_policies(self) -> None:
        while True:
            try:
                raw, source, by, pol, fut = self.policy_queue.get_nowait()
            except queue.Empty:
                return
            try:
                pol, raw, new = self.check_policy(raw, source, pol)
                version, was = len(self.policies), self._in_force()["version"]
                if new is None:
                    fut.set_result({**self.policy_view(), "applied": False,
                                    "message": f"identical to version {was}, in force: nothing applied"})
                    continue
                now = max(self.clock(), self.sched.now)
                rows = [] if getattr(fut, "who", None) is None else [audit_row(
                    now, "policy-apply", fut.who, target=str(version + 1), detail={"source": source, "was": was})]
                self.store.append_policy(now, raw, by=by, source=source, audit_rows=rows)
            except Exception as exc:  # refused or not logged: nothing changed
                if getattr(fut, "who", None) is not None:
                    self.audit_later(audit_row(self.clock(), "policy-apply", fut.who, audit_outcome(exc),
                                               detail={"source": source, "error": str(exc)[:2000]}))
                fut.set_exception(exc)
                continue
            self.sched, self.rules = new, pol.rules
            self.policies.append({"version": version + 1, "t": now, "by": by, "source": source, "policy": raw})
            self.deferred.append(Tick(0.0))  # a cycle under the new rules in this step (logged, so replayed)
            self._snapshot_due = True  # a restart then never restores under the old rules first
            log.info("policy version %d applied by %r from %s", version + 1, by, source)
            fut.set_result({**self.policy_view(), "applied": True,
                            "message": f"version {version + 1} applied (was {was})" + self._never_start_note(new)})

    def _kept_specs(self) -> tuple[JobSpec, ...]:
        """The specs of the jobs kept from the core and still waiting (note 021)."""
        return tuple(k.spec for k in self.kept.values() if k.state == "PENDING")

    def never_start_text(self, new: Scheduler) -> str:
        """``"; N job(s) can never start under it: ..."`` for the jobs no node of ``new``'s
        cluster could hold (``policy_change.never_start``: the waiting jobs and the kept
        ones); ``""`` when none. A policy check against the live server (dry run) says it
        as the apply would."""
        found = never_start(new, self._kept_specs())
        if not found:
            return ""
        return (f"; {len(found)} job{'s' if len(found) > 1 else ''} can never start under it: "
                + "; ".join(f"job {j!r}: {why}" for j, why in found))

    def _never_start_note(self, new: Scheduler) -> str:
        """``never_start_text``, logged as a warning when not empty (an applied policy)."""
        text = self.never_start_text(new)
        if text:
            log.warning("policy in force%s", text)
        return text

    def _in_force(self) -> dict:
        """The history entry of the policy in force: the last one not ``skipped``."""
        return next(p for p in reversed(self.policies) if "skipped" not in p)

    def policy_view(self, with_policy: bool = True) -> dict:
        """The policy in force: ``version``, ``t`` (epoch seconds), ``by``, ``source``
        and (``with_policy``) ``policy``, the parsed YAML."""
        cur = self._in_force()
        return {k: v for k, v in cur.items() if with_policy or k != "policy"}

    def audit_later(self, row: dict) -> None:
        """Queue an audit row (``store.audit_row``) of the API's own - a 403, a token used
        or refused - for the loop to commit with its next step (note 023). Thread-safe."""
        with self._audit_lock:
            self._audit_later.append(row)
        self.wake.set()

    def _take_audit_later(self) -> list[dict]:
        with self._audit_lock:
            rows, self._audit_later = self._audit_later, []
        return rows

    def _audit_command(self, now: float, kind: str, arg: Any, fut: Future, before: int) -> dict | None:
        """The audit row of one API command the loop took (``None``: not audited): who
        (``Command.who``), what, and how it ended (``audit_outcome`` of the future's
        exception; a submission's target is its new job id)."""
        who = getattr(fut, "who", None)
        if who is None:
            return None
        exc = fut.exception() if fut.done() else None
        detail: dict[str, Any] = {}
        if kind == "submit":
            spec, argv, shell, _env, cwd, array, _idem, defer, pty = arg
            target = str(before) if self.next_num != before else None
            team = spec.team
            detail = {"as_user": spec.user, "class": spec.workload_class, "gpus": spec.gpus,
                      "share": str(spec.share) if spec.share else None, "name": spec.name or None,
                      "command": audit_command(argv),
                      "shell": shell, "pty": pty, "cwd": cwd, "array": array[0] if array else None,
                      "mem_mib": spec.mem_mib or None, "cpus": spec.cpus or None}
            if target is None and exc is None:
                detail["replayed"] = True  # an Idempotency-Key seen before: no new job
            detail = {k: v for k, v in detail.items() if v not in (None, False)}
        else:
            target = arg if kind == "cancel" else arg[0]
            team = self.job_team(target)
            if kind == "update":
                detail = {"changes": arg[1]}
        if exc is not None:
            detail["error"] = str(exc)[:2000]
        return audit_row(now, kind, who, audit_outcome(exc), team=team, target=target, detail=detail)

    # ------------------------------------------------------------ the loop
    def _loop(self) -> None:
        while not self._stop.is_set():
            failed = False
            self.step_started_mono = time.monotonic()
            try:
                with self.lock:
                    self.step()
                self.last_step_mono, self.last_step_wall = time.monotonic(), time.time()
            except Exception as exc:  # a step must never kill the server; it is retried
                failed = True
                reason = storage_reason(exc)
                self.last_step_error = (time.monotonic(), f"storage unavailable: {reason}" if reason is not None
                                        else f"{type(exc).__name__}: {exc}")
                if reason is not None:  # one line per kind of failure a minute, no traceback (note 017)
                    self.ratelog.error(f"storage:{reason}", "reconcile step failed: storage unavailable: %s; "
                                       "retried (exits and lost runs are kept until committed)", reason)
                else:
                    self.ratelog.exception(f"step:{type(exc).__name__}", "reconcile step failed")
            self.step_started_mono = None
            if failed:  # back off: the lock is free for readers meanwhile
                self._fail_wait = min(max(self.poll_s, self._fail_wait * 2), MAX_FAILED_STEP_WAIT_S)
                self._stop.wait(self._fail_wait)
            else:
                self._fail_wait = 0.0
                with self.lock:
                    self._maybe_snapshot(max(self.clock(), self.sched.now))
                self.wake.wait(self.poll_s)
            self.wake.clear()

    def loop_check(self) -> dict[str, Any]:
        """``/readyz``'s loop check (note 019), without ``self.lock`` (a stalled loop holds
        it) and without I/O: ``ok`` when a step completed within ``ready_max_step_age_s``
        (monotonic seconds), with ``last_step_age_s``, the running step's
        ``step_running_s``, the last failed step's ``last_error`` and ``last_error_age_s``
        (``None``: none failed) and, when not ok, ``detail``."""
        now = time.monotonic()
        last, running, limit = self.last_step_mono, self.step_started_mono, self.ready_max_step_age_s
        failed = self.last_step_error
        alive = self._thread is not None and self._thread.is_alive() and not self._stop.is_set()
        age = None if last is None else now - last
        loop: dict[str, Any] = {"ok": alive and age is not None and age <= limit, "max_step_age_s": limit,
                                "last_step_age_s": None if age is None else round(age, 3),
                                "step_running_s": None if running is None else round(max(0.0, now - running), 3),
                                "last_error": failed[1] if failed else None,
                                "last_error_age_s": round(now - failed[0], 3) if failed else None}
        if not alive:
            loop["detail"] = "the reconcile loop is not running"
        elif age is None:
            loop["detail"] = "the reconcile loop has not completed a step yet"
        elif age > limit:
            loop["detail"] = (f"no step completed for {age:.1f} s (more than {limit:g} s)"
                              + (f"; one has been running for {now - running:.1f} s" if running is not None else "")
                              + (f"; the last failed: {failed[1]}" if failed and failed[0] > last else ""))
        return loop

    def store_check(self) -> dict[str, Any]:
        """``/readyz``'s store check (note 019): ``ok`` when the database answers one read
        (``Store.ping``), this server still holds its lock, and no statement of this
        server failed on the storage within ``ready_max_step_age_s`` seconds (a
        write-locked or full database answers reads but every submission 503);
        ``detail`` says why not. Blocks as long as that read takes: call it off the
        event loop."""
        from sqlalchemy.exc import SQLAlchemyError

        try:
            holds = self.store.ping()
        except (SQLAlchemyError, OSError) as exc:
            reason = storage_reason(exc) or f"{type(exc).__name__}: {exc}"
            return {"ok": False, "detail": f"the database does not answer: {reason}"}
        if not holds:
            return {"ok": False, "detail": "another server holds the database lock"}
        last = self.store.last_error
        if last is not None and time.monotonic() - last[0] <= self.ready_max_step_age_s:
            return {"ok": False, "detail": f"a database operation failed {time.monotonic() - last[0]:.1f} s ago: "
                                           f"{last[1]} (failures in the last {self.ready_max_step_age_s:g} s "
                                           "make the server not ready)"}
        return {"ok": True}

    def step(self) -> list[Decision]:
        """One pass of the loop (called with ``self.lock`` held); returns the decisions.

        Nothing the backend reported is forgotten when the step fails (note 017): exits
        stay in ``_exits`` until the batch reporting them is committed, lost runs in
        ``_lost_due`` until handed over, runs in ``_launches`` until their attempt is
        committed. After the core has decided, nothing raises.

        Raises:
            SQLAlchemyError: the batch could not be committed; the step's submissions and
                cancels were answered ``StorageUnavailable`` and are not retried.
        """
        self._apply_policies()  # first: this step's events are handled under the new rules
        sched, backend = self.sched, self.backend
        now = max(self.clock(), sched.now)
        self._retry_writes()
        if now - self._beat >= HEARTBEAT_S:
            self._beat = now
            if not self.store.heartbeat(now):
                log.error("another server took over the database lock; stopping")
                self._stop.set()
                return []
        carry, self.deferred = self.deferred, []
        batch: list[Event] = [replace(e, t=now) for e in carry]
        killed_ends = getattr(backend, "killed_ends", set())
        for job_id, code in backend.exits():
            self._exits[job_id] = code
            run = self.live_run.pop(job_id, None)
            self.kills.pop(job_id, None)
            if code is None and job_id in killed_ends:
                killed_ends.discard(job_id)
                log.info("job %s: run %s ended by this server's SIGKILL: %s", job_id,
                         run if run is not None else "?", self._kill_why(sched.jobs.get(job_id)))
        lost: list[RunLost] = []
        ended: list[RunEnded] = []
        causes = getattr(backend, "end_causes", {})
        exit_rows = {}
        for job_id, code in self._exits.items():
            exit_rows[job_id] = dict(exit_code=code, kill_at=None)
            job = sched.jobs.get(job_id)
            if job is None or not job.state.holds_gpus:
                continue  # a cancelled or requeued run ending: the core released it already
            if code is None:
                events, rec = self._lost_run(now, job, getattr(backend, "lost_causes", {}).get(job_id, "unknown"))
                batch.extend(events)
                if rec is not None:
                    lost.append(rec)
            else:
                status = self._exit_of(job, code)
                if job_id in causes:  # OUT_OF_MEMORY (note 023): a failure whatever the code
                    rec = RunEnded(now, job_id, self.runs[job_id], *causes[job_id])
                    batch.append(rec)
                    ended.append(rec)
                    status = ExitStatus.FAILED
                batch.append(JobFinished(now, job_id, status))
        engine_events = getattr(backend, "events", None)  # nodes lost / back, GPU health (note 016)
        if engine_events is not None:
            batch.extend(replace(e, t=now) for e in engine_events())
        handed = []
        for job_id, (run, due) in sorted(self._lost_due.items()):
            if due > now:
                continue
            handed.append(job_id)
            job = sched.jobs.get(job_id)
            if job is not None and job.state.holds_gpus and self.runs[job_id] == run and job_id not in self._exits:
                batch.append(replace(self._lost(job), t=now))
        for job_id, (run, due) in list(self.kills.items()):
            if due <= now:
                if self.live_run.get(job_id) == run:
                    backend.kill(job_id)
                del self.kills[job_id]
        rows, replies, new_arrays, keys = [], [], [], []
        later = self._take_audit_later()
        audits: list[dict] = []  # the rows of this step's commands (note 023)
        self._kept_staged, self._busy = {}, None
        cmds = []
        while True:
            try:
                cmds.append(self.commands.get_nowait())
            except queue.Empty:
                break
        if any(getattr(cmd[2], "open_check", False) for cmd in cmds):
            cmds = self._confirm_open(cmds)
        for cmd in cmds:
            before = self.next_num
            self._command(now, cmd, batch, rows, replies, new_arrays, keys)
            row = self._audit_command(now, cmd[0], cmd[1], cmd[2], before)
            if row is not None:
                audits.append(row)
        self._release_kept(now, batch)
        children = self._array_children(now, batch, rows, new_arrays)
        replicas = self.services.reconcile(now, batch, rows)
        if self.inventory is not None and now >= self._next_sample:
            self._next_sample = now + self.sample_every
            try:
                batch.extend(self._sample(now))
                self.metrics.sampled(now)
            except InventoryError as exc:  # a bad scripted file: one line naming the field, no traceback
                log.error("GPU sample skipped: %s", exc)
            except Exception:  # a failed sample (a bad scripted file, NVML trouble) is skipped whole
                log.exception("GPU sample failed; skipped")
        wake = sched.next_wakeup()
        if not any(not isinstance(e, DAEMON_EVENTS) for e in batch) and wake is not None and wake <= now:
            batch.append(Tick(now))
        if not batch and not new_arrays and not exit_rows and not keys:
            if later or audits:  # refused commands, 403s, token uses: the audit log alone
                try:
                    self.store.write_audit(later + audits)
                except Exception as exc:
                    self.ratelog.error(f"audit:{storage_reason(exc) or type(exc).__name__}", "audit rows not "
                                       "written yet: %s; retried", storage_reason(exc) or exc)
                    with self._audit_lock:
                        self._audit_later[:0] = later + audits
            for fut, value in replies:  # nothing to commit (an idempotent replay): answered now
                if not fut.done():
                    fut.set_result(value() if callable(value) else value)
            return []
        try:  # committed before it is applied or acknowledged
            self.store.append(now, batch, rows, [self._array_row(a) for a in new_arrays], job_updates=exit_rows,
                              idempotency=keys, audit_rows=later + audits)
        except Exception as exc:
            reason = storage_reason(exc) or f"{type(exc).__name__}: {exc}"
            for fut, _ in replies:
                if not fut.done():
                    fut.set_exception(StorageUnavailable(reason))
            # retried next step: what the loop found itself (exits, lost runs and ticks are
            # derived again); never the API's submissions and cancels, answered 503 above
            self.deferred = carry + [e for e in batch if isinstance(e, (UsageSample, GpuUnmanaged))]
            self._kept_staged = {}
            for r in audits:  # answered 503 above: nothing of them was applied
                if r["outcome"] == "ok":
                    r["outcome"] = "failed"
            with self._audit_lock:  # retried with the next step
                self._audit_later[:0] = later + audits
            raise
        for job_id in self._exits:
            causes.pop(job_id, None)
            self.ended_unsignalled.pop(job_id, None)
        self._exits.clear()
        for rec in ended:
            self.end_reasons[rec.job_id] = (rec.run, rec.reason, rec.detail)
        for job_id, k in self._kept_staged.items():  # committed: kept jobs' changes apply
            if k is None:
                self.kept.pop(job_id, None)
            else:
                self.kept[job_id] = k
                if k.state != "PENDING":
                    self._pending_rows.setdefault(job_id, {})["state"] = k.state
        self._kept_staged = {}
        for rec in lost:
            self.lost.setdefault(rec.job_id, []).append(rec)
            if not rec.final:
                self._lost_due[rec.job_id] = (rec.run, now + self._backoff(len(self.lost[rec.job_id])))
        for job_id in handed:
            self._lost_due.pop(job_id, None)
        for a in new_arrays:
            self.arrays[a.id] = a
        for array_id, index, job_id in children:
            self.arrays[array_id].submitted(index, job_id)
        self.services.committed(replicas)
        self._idempotent_committed(keys)
        core_batch = [e for e in batch if not isinstance(e, DAEMON_EVENTS)]
        t0 = time.perf_counter()
        decisions = sched.handle(core_batch)
        self.metrics.observe_cycle(time.perf_counter() - t0)
        for d in decisions:
            self._track(d)  # placements and run numbers, before the replies' views
        self.metrics.observe(now, core_batch, decisions)
        # every answer first, then the futures in one go: each completion wakes the event
        # loop, which then takes the GIL; woken once per step, not once per answer (note 032)
        answer_all([(fut, value() if callable(value) else value) for fut, value in replies if not fut.done()])
        touched = {getattr(e, "job_id", None) or (e.spec.id if isinstance(e, JobSubmitted) else None)
                   for e in core_batch}
        touched |= {d.job_id for d in decisions}
        for j in touched:
            if j in sched.jobs:
                self._pending_rows.setdefault(j, {})["state"] = sched.jobs[j].state.value
        fresh = {r["id"]: r for r in rows}  # a job submitted in this step: its row is at hand
        for d in decisions:
            if isinstance(d, Start):
                self._launches.append((d.job_id, self.runs[d.job_id], d.placement, fresh.get(d.job_id)))
            else:
                self._apply(now, d)
        self._do_launches()
        return decisions

    def _retry_writes(self) -> None:
        """Runs and jobs-row writes a failed step left (never raises)."""
        if self._launches or self._pending_rows:
            self._do_launches()

    def _apply(self, now: float, d: Decision) -> None:
        """Act on a decision other than ``Start`` (``_do_launches`` starts runs). Never
        raises: a ``kill_at`` that cannot be written is re-armed from the core at a
        restart."""
        if isinstance(d, (Preempt, Stop)):
            run = self.live_run.get(d.job_id)
            if run is None:
                return  # no process (lost, never launched, ended): nothing to signal or kill
            job = self.sched.jobs.get(d.job_id)
            try:
                if isinstance(d, Stop) and d.grace_s <= 0 and (d.requeue or d.reason == "cancelled"):
                    self.backend.kill(d.job_id)  # the core released its GPUs already: nothing may outlive that
                    self.kills.pop(d.job_id, None)
                    return
                if isinstance(d, Preempt) and self._ended_already(d.job_id):
                    # it exited after this step read the exits, before this signal (note 048)
                    self.ended_unsignalled[d.job_id] = run
                self.backend.signal(d.job_id, getattr(signal, job.cls.stop_signal if job else "SIGTERM"))
            except Exception:  # an engine command that failed: the kill at the end of the grace is the backstop
                self.ratelog.exception(f"signal:{d.job_id}", "job %s: cannot signal or kill its run", d.job_id)
            due = now + d.grace_s
            self.kills[d.job_id] = (run, due)
            self._pending_rows.setdefault(d.job_id, {})["kill_at"] = due
        elif isinstance(d, Reject):
            log.info("job %s rejected: %s", d.job_id, d.reason)
        elif isinstance(d, ReconfigureMig):
            log.warning("MIG reconfiguration of %s GPU %d is not supported by the local backend yet", d.node, d.gpu)

    def _do_launches(self) -> None:
        """Start the runs in ``_launches`` and write ``_pending_rows``, never raising:
        the attempts (and the rows' states) are committed first, then the forks, then
        the pids (note 008, "Submission throughput"); a commit that fails leaves the
        runs queued for the next step - a fork never comes before its attempt is in the
        database, so a restart never launches a run twice. A run whose job no longer
        holds GPUs for it (cancelled meanwhile) is dropped."""
        launches, waiting = [], []
        held = getattr(self.backend, "gpus_held", None)
        for job_id, run, placement, row in self._launches:
            job = self.sched.jobs.get(job_id)
            if job is not None and job.state.holds_gpus and self.runs[job_id] == run:
                holder = held(placement) if held is not None else None
                if holder is not None:  # note 023: GPUs are handed on once every process of the last run is gone
                    self.ratelog.log(logging.INFO, f"held:{job_id}", "job %s: start deferred until nothing is left "
                                     "of %s (its GPUs are handed on then)", job_id, holder)
                    waiting.append((job_id, run, placement, row))
                    continue
                launches.append((job_id, run, placement, row))
        values = {j: dict(v) for j, v in self._pending_rows.items()}
        for job_id, run, _placement, _row in launches:
            values.setdefault(job_id, {}).update(run=run, pid=None, pgid=None, proc_start=None, exit_code=None,
                                                 kill_at=None)
        try:
            self.store.update_jobs(values)
            launches = [(j, r, p, row if row is not None else self.store.job_row(j)) for j, r, p, row in launches]
        except Exception as exc:
            self.ratelog.error(f"launch:{storage_reason(exc) or type(exc).__name__}", "runs not launched yet (their "
                               "attempts cannot be committed: %s); retried", storage_reason(exc) or exc)
            self._launches = launches + waiting
            return
        self._launches, self._pending_rows = waiting, {}
        started = {}
        for job_id, run, placement, row in launches:
            if self.live_run.get(job_id) is not None and self.backend.running(job_id):
                self.backend.kill(job_id)  # an earlier run still tracked: its GPUs were released already
            self.kills.pop(job_id, None)  # a kill armed for an earlier run never reaches this one
            job = self.sched.jobs[job_id]
            local = dict(user=job.spec.user, mem_mib=job.spec.mem_mib, cpus=job.spec.cpus, pty=bool(row.get("pty"))) \
                if self.backend.kind == "local" else {}
            try:
                proc = self.backend.start(job_id, run, json.loads(row["argv"]), shell=row["shell"],
                                          env=json.loads(row["env"]), cwd=row["cwd"], placement=placement,
                                          time_limit_s=self._limit_s(job_id), **local)
            except (OSError, ValueError, TypeError, BackendError) as exc:  # e.g. an environment the OS refuses
                log.error("job %s: cannot start its runner: %s", job_id, exc)
                self.launch_errors[job_id] = f"run {run}: cannot start: {exc}"
                self.live_run.pop(job_id, None)
                started[job_id] = dict(placement=str(placement))
                # logged with the exit it causes: the cause outlives a restart (note 018)
                self.deferred += [LaunchFailed(0.0, job_id, run, self.launch_errors[job_id]),
                                  JobFinished(0.0, job_id, ExitStatus.FAILED)]
                continue
            self.live_run[job_id] = run
            rdir = str(self.backend.run_dir(job_id, run))  # joined as text: one Path per run (note 032)
            started[job_id] = dict(pid=proc.pid, pgid=proc.pid, proc_start=proc.start, placement=str(placement),
                                   stdout=os.path.join(rdir, "stdout"), stderr=os.path.join(rdir, "stderr"))
        try:
            self.store.update_jobs(started)
        except Exception as exc:  # the pids: a restart finds the runs by their environment (find_runner)
            self.ratelog.error(f"pids:{storage_reason(exc) or type(exc).__name__}", "pids of started runs not "
                               "written yet: %s; retried", storage_reason(exc) or exc)
            self._pending_rows.update(started)

    def _confirm_open(self, cmds: list[tuple]) -> list[tuple]:
        """``cmds`` less those sent without a token as to an open server
        (``Command.open_check``) when the database has (or had) a token now: one read of
        the tokens' version for the step, made after every command of ``cmds`` was
        queued, so a token committed before a request arrived is seen, whichever process
        created it (note 032). Those are refused with ``TokenRequired``; if the read
        fails, with ``StorageUnavailable``. Never raises."""
        try:
            self.store.active_tokens_cached()
            refusal = TokenRequired(NO_TOKEN) if self.store.had_tokens_cached() else None
        except Exception as exc:
            refusal = StorageUnavailable(storage_reason(exc) or f"{type(exc).__name__}: {exc}")
        if refusal is None:
            return cmds
        for _kind, _arg, fut in cmds:
            if getattr(fut, "open_check", False) and not fut.done():
                fut.set_exception(refusal)
        return [cmd for cmd in cmds if not getattr(cmd[2], "open_check", False)]

    def _command(self, now: float, cmd: tuple, batch: list, rows: list, replies: list, new_arrays: list,
                 keys: list) -> None:
        kind, arg, fut = cmd
        if kind == "submit":
            spec, argv, shell, env, cwd, array, idem, defer, pty = arg
            if idem is not None and self._idempotent_replay(idem, fut, replies, keys):
                return
            job_id = str(self.next_num)
            spec = replace(spec, id=job_id, submit_time=now)
            kept = None
            try:
                validate_spec(self.rules, spec)
                why = class_refusal(self.rules, spec) or self._unrunnable(spec) or self._no_terminal(pty, array)
                if why is not None:
                    raise SpecError(f"job {job_id!r}: {why}")
                if defer is not None:
                    if array is not None:
                        raise SpecError(f"job {job_id!r}: array: {array[0]!r} is not allowed with a dependency, "
                                        "begin time or hold (not supported for arrays yet)")
                    kept = self._new_kept(spec, defer, now)
                    if self._misfit(spec) is not None:
                        # no node could ever hold it: rejected now by the core, as a plain job
                        # (and sbatch's "Requested node configuration is not available"), not
                        # kept for hours to be rejected when its dependency or begin time allows
                        kept = None
                if array is not None:  # checked whole before it is taken: nothing half-applied
                    try:
                        check_array(*array)
                    except ValueError as exc:
                        raise SpecError(f"job {job_id!r}: {exc}") from None
                    misfit = self._misfit(spec)
                    if misfit is not None:
                        raise SpecError(f"job {job_id!r}: array: {array[0]!r} is not allowed: each task would be "
                                        f"rejected: {misfit}")
            except SpecError as exc:
                fut.set_exception(exc)
                return
            self.next_num += 1
            if idem is not None:
                keys.append(dict(scope=idem[0], key=idem[1], body_hash=idem[2], job_id=job_id, created=now))
            if array is not None:
                text, indices, throttle, max_retries = array
                rec = ArrayRec(id=job_id, num=int(job_id), text=text, indices=indices, throttle=throttle,
                               max_retries=max_retries, submit_time=now, spec=spec_to_dict(spec), argv=argv,
                               shell=shell, env=env, cwd=cwd)
                rec.rebuild(self.job_state, self.job_started)
                new_arrays.append(rec)
                replies.append((fut, lambda j=job_id: self.job_view(j)))
                return
            why = self.kept_why(kept, now) if kept is not None else None
            if why is not None:  # kept from the core until its dependency, begin time or hold allow (note 021)
                kept.history.append([now, "", "PENDING", f"submitted; kept: {why}"])
                self._kept_staged[job_id] = kept
                batch.append(JobKept(now, job_id, kept_to_dict(kept, spec_to_dict)))
            else:
                batch.append(JobSubmitted(now, spec))
            row = dict(id=job_id, num=int(job_id), spec=self.store.spec_text(spec), argv=json.dumps(argv),
                       shell=shell, pty=pty, env=json.dumps(env), cwd=cwd, state=JobState.PENDING.value, run=0)
            rows.append(row)
            replies.append((fut, lambda j=job_id, r=row: self.job_view(j, {**r, "exit_code": None})))
        elif kind == "cancel" and arg in self.arrays:
            rec = self.arrays[arg]
            if rec.cancelled is None:
                try:
                    self.store.cancel_array(arg, now)  # committed first; its children are cancelled below
                except Exception as exc:
                    fut.set_exception(StorageUnavailable(storage_reason(exc) or f"{type(exc).__name__}: {exc}"))
                    return
                rec.cancelled = now
            replies.append((fut, lambda r=rec: self._array_progress(r)["state"]))
        elif kind == "cancel" and self._kept_now(arg) is not None:  # never reached the core (note 021)
            k = self._kept_now(arg)
            if k.state == "PENDING":
                k = k.changed(now, "cancelled", state=JobState.CANCELLED.value, ended=now)
                self._kept_staged[arg] = k
                batch.append(JobKept(now, arg, kept_to_dict(k, spec_to_dict)))
            fut.set_result(k.state)
        elif kind in ("hold", "release", "update", "requeue"):
            try:
                self._job_action(now, kind, *arg, batch, replies)
            except (KeyError, JobActionRefused, SpecError) as exc:
                fut.set_exception(exc)
                return
            replies.append((fut, lambda j=arg[0]: self.job_view(j)))
        elif kind == "cancel":
            job = self.sched.jobs.get(arg)
            if job is None and arg in self.ended_states:  # ended before this server started
                fut.set_result(self.ended_states[arg])
            elif job is None:
                fut.set_exception(KeyError(arg))
            elif job.state.terminal or any(isinstance(e, JobCancelled) and e.job_id == arg for e in batch):
                fut.set_result(job.state.value)
            else:
                batch.append(JobCancelled(now, arg))
                replies.append((fut, lambda j=job: j.state.value))

    def _unrunnable(self, spec: JobSpec) -> str | None:
        """Why the backend could never run ``spec`` (note 023): a user that is no Unix user
        where jobs run as their users, ``mem_mib``/``cpus`` without their cgroup controller
        or under another backend; ``None``: it can."""
        check = getattr(self.backend, "check_job", None)
        if check is not None:
            return check(spec.user, spec.mem_mib, spec.cpus)
        if spec.mem_mib or spec.cpus:
            name = "mem_mib" if spec.mem_mib else "cpus"
            return (f"{name}: {getattr(spec, name):g} is not allowed with the {self.backend.kind} backend: host memory "
                    "and CPU limits are the local backend's (cgroup v2)")
        return None

    def _no_terminal(self, pty: bool, array) -> str | None:
        """Why a job with ``pty`` cannot be run (note 041): a terminal is relayed by this
        server for its own (local) runs only, and one session is one job, never an array."""
        if not pty:
            return None
        if self.backend.kind != "local":
            return (f"pty: true is not allowed with the {self.backend.kind} backend: a terminal is relayed for the "
                    "local backend's runs only (design note 041)")
        if array is not None:
            return f"pty: true is not allowed with array {array[0]!r}: one terminal session is one job"
        return None

    def _kept_now(self, job_id: str) -> Kept | None:
        """A kept job as this step has it (its staged change first); ``None``: not kept."""
        if job_id in self._kept_staged:
            return self._kept_staged[job_id]
        return self.kept.get(job_id)

    def _job_known(self, job_id: str) -> bool:
        return (job_id in self.sched.jobs or self._kept_now(job_id) is not None or job_id in self.arrays
                or job_id in self.ended_states)

    def _new_kept(self, spec: JobSpec, defer: dict, now: float) -> Kept:
        """The ``Kept`` record of a submission with ``defer`` (``submit_future``).

        Raises:
            SpecError: a dependency naming a job that does not exist, ``singleton``
                without a name, a dependency or begin time that does not parse.
        """
        text = (defer.get("dependency") or "").strip()
        try:
            deps = parse_dependency(text) if text else ()
        except ValueError as exc:
            raise SpecError(f"job {spec.id!r}: dependency: {exc}") from None
        for dep in deps:
            if dep.kind == "singleton" and not spec.name:
                raise SpecError(f"job {spec.id!r}: dependency: 'singleton' is not allowed without a job name: "
                                "give the job a name (-J/--name); singleton orders the jobs of one name and user")
            for i in dep.ids:
                if not self._job_known(i):
                    raise SpecError(f"job {spec.id!r}: dependency: {text!r} is not allowed: job {i} does not "
                                    "exist (a dependency names the id of a job submitted before)")
        begin = defer.get("begin")
        try:
            begin = parse_begin(begin, now) if begin is not None else None
        except ValueError as exc:
            raise SpecError(f"job {spec.id!r}: begin: {exc}") from None
        self._check_begin_deadline(spec, begin)
        return Kept(spec, dependency=text, begin=begin, held=bool(defer.get("held")))

    @staticmethod
    def _check_begin_deadline(spec: JobSpec, begin: float | None) -> None:
        """A begin time at or after the job's deadline (note 022) is refused, as Slurm's
        "Incompatible begin and deadline time specification".

        Raises:
            SpecError: naming ``begin``, both times and what is allowed.
        """
        if begin is not None and spec.deadline is not None and begin >= spec.deadline:
            raise SpecError(f"job {spec.id!r}: begin: {fmt_time(begin)} is not allowed: before the job's deadline "
                            f"{fmt_time(spec.deadline)} (it could never end by it)")

    def _release_kept(self, now: float, batch: list) -> None:
        """Hand every kept job whose dependency, begin time and hold now allow to the core,
        in id order, as a submission with its original submit time (note 021). A spec the
        policy in force refuses stays kept (``BadConstraints``)."""
        ids = [j for j in self.kept if j not in self._kept_staged] + list(self._kept_staged)
        for job_id in sorted(ids, key=natural_key):
            k = self._kept_now(job_id)
            if k is None or k.state != "PENDING" or kept_reason(k, now, self.job_state, self._is_busy) is not None:
                continue
            try:
                validate_spec(self.rules, k.spec)
            except SpecError as exc:
                self._kept_bad[job_id] = re.sub(r"^job '[^']*': ", "", str(exc))
                continue
            self._kept_bad.pop(job_id, None)
            batch.append(JobSubmitted(now, k.spec))
            self._kept_staged[job_id] = None
            if self._busy is not None and k.spec.name:
                self._busy.add((k.spec.name, k.spec.user))

    def _job_action(self, now: float, kind: str, job_id: str, changes: dict, admin: bool, batch: list,
                    replies: list) -> None:
        """One ``job_action`` in the loop: the events it adds to ``batch``.

        Raises:
            KeyError, JobActionRefused, SpecError: as ``job_action``.
        """
        if job_id in self.arrays:
            raise JobActionRefused(f"job {job_id} is an array: {kind} its elements (ID_INDEX) instead")
        k = self._kept_now(job_id)
        job = self.sched.jobs.get(job_id)
        state = k.state if k is not None else job.state.value if job is not None else self.ended_states.get(job_id)
        if state is None:
            raise KeyError(job_id)
        if kind == "requeue":
            if job is None or job.state is not JobState.RUNNING:
                raise JobActionRefused(f"job {job_id} is {state}: only a RUNNING job can be requeued (scontrol "
                                       "requeue); a pending job is queued already")
            if not any(isinstance(e, JobRequeueRequested) and e.job_id == job_id for e in batch):
                batch.append(JobRequeueRequested(now, job_id))
            return
        if kind == "update" and k is None:
            self._update_in_core(now, job_id, state, changes, admin, batch)
            return
        if k is None or k.state != "PENDING":
            if state == "PENDING" and kind == "release":
                raise JobActionRefused(f"job {job_id} is not held: it is queued in the scheduler already")
            if state == "PENDING":
                raise JobActionRefused(
                    f"job {job_id} is queued in the scheduler already: it cannot be {'held' if kind == 'hold' else 'updated'}"
                    " (the scheduling core cannot take a pending job back yet, design note 021); this works for jobs "
                    "waiting for a dependency or begin time or submitted with --hold: cancel it and submit it again "
                    "with --hold")
            raise JobActionRefused(f"job {job_id} is {state}: only a pending job can be "
                                   f"{ {'hold': 'held', 'release': 'released', 'update': 'updated'}[kind] }"
                                   + ("; `shepherd requeue` stops a running one and queues it again"
                                      if state == "RUNNING" else ""))
        if kind == "hold":
            new = k if k.held else k.changed(now, "held by its user", held=True)
        elif kind == "release":
            new = k.changed(now, "released", held=False) if k.held else k
        else:
            spec, begin = k.spec, k.begin
            cls = self.rules.classes.get(spec.workload_class)  # none: validate_spec says so below
            bad = None if cls is None or not {"time_limit_s", "nice"} & set(changes) else update_error(
                spec, cls, changes.get("time_limit_s"), changes.get("nice"), admin)
            if bad is not None:  # the core's rule (note 039)
                raise SpecError(f"job {job_id!r}: {bad}")
            if "time_limit_s" in changes:
                spec = replace(spec, time_limit_s=changes["time_limit_s"])
            if "nice" in changes:
                spec = replace(spec, nice=changes["nice"])
            if "name" in changes:
                spec = replace(spec, name=changes["name"])
            validate_spec(self.rules, spec)  # SpecError naming the field
            if changes.get("begin") is not None:
                try:
                    begin = parse_begin(changes["begin"], now)
                except ValueError as exc:
                    raise SpecError(f"job {job_id!r}: begin: {exc}") from None
                self._check_begin_deadline(spec, begin)
            if any(d.kind == "singleton" for d in k.deps) and not spec.name:
                raise SpecError(f"job {job_id!r}: name: '' is not allowed: the job's dependency is singleton")
            new = k.changed(now, "updated: " + ", ".join(sorted(changes)), spec=spec, begin=begin)
        if new is not k:
            self._kept_staged[job_id] = new
            batch.append(JobKept(now, job_id, kept_to_dict(new, spec_to_dict)))

    def _update_in_core(self, now: float, job_id: str, state: str, changes: dict, admin: bool, batch: list) -> None:
        """``update`` of a job the core has (note 039): its time limit and nice, pending or
        running, as a ``JobUpdated`` the core checks (``core/amend.py``) and applies.

        Raises:
            JobActionRefused: a job that ended, or a change of ``name`` or ``begin``
                (those change only while the server keeps the job, note 021).
            SpecError: a change the rules refuse (field, value, what is allowed).
        """
        if state not in ("PENDING", "RUNNING", "PREEMPTING", "STOPPING"):
            raise JobActionRefused(f"job {job_id} is {state}: time_limit_s and nice change only for a pending or "
                                   "running job")
        other = sorted(set(changes) - {"time_limit_s", "nice"})
        if other:
            raise JobActionRefused(
                f"job {job_id} is {state} (queued in the scheduler already): {', '.join(other)} cannot be changed "
                "now; time_limit_s and nice can (name and begin change only while the job is held or waits for a "
                "dependency or begin time, design note 021)")
        if any(isinstance(e, JobUpdated) and e.job_id == job_id for e in batch):
            # checked against the core as it is before this step: a second one would be
            # judged on a stale state (the core would refuse it at apply, silently)
            raise JobActionRefused(f"job {job_id} has another update in this step: send this one again")
        event = JobUpdated(now, job_id, time_limit_s=changes.get("time_limit_s"), nice=changes.get("nice"),
                           admin=admin)
        self.sched.check_update(event)  # SpecError naming the field
        batch.append(event)

    def _idempotent_replay(self, idem: tuple[str, str, str], fut: Future, replies: list, keys: list) -> bool:
        """Answer a submission whose ``Idempotency-Key`` is known - committed (memory,
        then the database) or taken earlier in this step - and return ``True``; ``False``:
        a new key, submit as usual. The same body: ``("replayed", view)``; another body:
        ``IdempotencyConflict`` (note 017)."""
        scope, key, digest = idem
        found = next(((k["body_hash"], k["job_id"]) for k in keys if (k["scope"], k["key"]) == (scope, key)), None)
        if found is None:
            found = self._idem.get((scope, key))
        if found is None:
            try:
                found = self.store.idempotency_get(scope, key)
            except Exception as exc:
                fut.set_exception(StorageUnavailable(storage_reason(exc) or type(exc).__name__))
                return True
        if found is None:
            return False
        known_hash, job_id = found
        if known_hash != digest:
            fut.set_exception(IdempotencyConflict(key, job_id))
        else:
            replies.append((fut, lambda j=job_id: ("replayed", self.job_view(j))))
        return True

    def _idempotent_committed(self, keys: list[dict]) -> None:
        """Remember the idempotency keys of committed submissions (at most
        ``IDEMPOTENCY_CACHE`` in memory; older ones are read from the database)."""
        for k in keys:
            self._idem[(k["scope"], k["key"])] = (k["body_hash"], k["job_id"])
        while len(self._idem) > IDEMPOTENCY_CACHE:
            self._idem.pop(next(iter(self._idem)))

    def _misfit(self, spec: JobSpec) -> str | None:
        """Why no node could ever hold ``spec`` (the reason the core would reject it
        with at submit, a gang's layout included: ``Scheduler.spec_misfit``); ``None``:
        one could. Changes no decision."""
        return self.sched.spec_misfit(spec)

    @staticmethod
    def _array_row(a: ArrayRec) -> dict:
        return dict(id=a.id, num=a.num, array=a.text, indices=json.dumps(a.indices), throttle=a.throttle,
                    max_retries=a.max_retries, submit_time=a.submit_time, spec=json.dumps(a.spec),
                    argv=json.dumps(a.argv), shell=a.shell, env=json.dumps(a.env), cwd=a.cwd, cancelled=a.cancelled)

    def _array_progress(self, rec: ArrayRec) -> dict:
        rec.update(self.job_state, self.job_started)
        return rec.counts(self.job_state)

    def job_started(self, job_id: str) -> bool:
        """Whether a job ever started: its first start in the core, a Start decision this
        server made, an end only a run reaches, else its archived record's first start."""
        job = self.sched.jobs.get(job_id)
        if job is not None:
            return job.first_start is not None
        if self.runs.get(job_id) or self.ended_states.get(job_id) in ("COMPLETED", "FAILED", "TIMEOUT"):
            return True
        if self.ended_states.get(job_id) != "CANCELLED":
            return False
        return self.store.ended_records([job_id]).get(job_id, {}).get("first_start") is not None

    def _array_children(self, now: float, batch: list, rows: list, new_arrays: list) -> list[tuple[str, int, str]]:
        """Submit the chunks each array may run now (index order; at most its throttle,
        and never more than ``MAX_LIVE_TASKS``, not yet ended; at most
        ``MAX_TASKS_PER_STEP`` new ones per step over all arrays: lazy expansion, note
        017; a FAILED chunk again while it has retries left) and cancel the live children
        of a cancelled array. O(live children) per array. Returns ``(array, index,
        child id)`` of the children added to ``batch``, to be recorded once it is
        committed."""
        out = []
        budget = MAX_TASKS_PER_STEP
        cancelling = {e.job_id for e in batch if isinstance(e, JobCancelled)}
        for rec in [*self.arrays.values(), *new_arrays]:
            if rec.ended:
                continue
            p = self._array_progress(rec)
            if rec.cancelled is not None:
                for job_id in sorted(rec.live, key=natural_key):
                    job = self.sched.jobs.get(job_id)
                    if job is not None and not job.state.terminal and job.id not in cancelling:
                        batch.append(JobCancelled(now, job.id))
                rec.ended = p["state"] == "CANCELLED"
                continue
            if p["state"] in ("COMPLETED", "FAILED", "CANCELLED"):  # every chunk ended (a chunk cancelled)
                rec.ended = True
                continue
            room = min(rec.throttle, MAX_LIVE_TASKS) - p["live"]
            for index, attempt in rec.take(max(0, min(room, budget))):
                budget -= 1
                job_id = child_id(rec.id, index, attempt)
                spec = replace(spec_from_dict(rec.spec), id=job_id, submit_time=now)
                env = {**rec.env, "SHEPHERD_ARRAY_ID": rec.id, "SHEPHERD_ARRAY_TASK_ID": str(index),
                       "SHEPHERD_ARRAY_TASK_ATTEMPT": str(attempt)}
                batch.append(JobSubmitted(now, spec))
                rows.append(dict(id=job_id, num=self.next_num, spec=self.store.spec_text(spec),
                                 argv=json.dumps(rec.argv), shell=rec.shell, pty=False, env=json.dumps(env),
                                 cwd=rec.cwd, state=JobState.PENDING.value, run=0))
                self.next_num += 1
                out.append((rec.id, index, job_id))
        return out

    # ------------------------------------------------------------ GPU samples (note 008)
    def _sample(self, now: float) -> list[Event]:
        """One GPU sample: the events it brings (a job's ``UsageSample`` when it tells
        the core something new, ``GpuUnmanaged`` when a GPU's foreign processes come or
        go); updates the live views."""
        node = self.node
        tracked = self.backend.procs
        members = procs.group_members(p.pid for p in tracked.values())
        for p in tracked.values():  # a job's processes that left its group are still in its cgroup (note 023)
            if getattr(p, "cgroup", None) is not None:
                members[p.pid] = members.get(p.pid, frozenset()) | frozenset(p.cgroup.pids())
        pids_now = frozenset().union(*members.values()) if members else frozenset()
        # a process of a job that just ended may linger in NVML's list for a moment: ours
        managed, self._last_pids = pids_now | self._last_pids, pids_now
        devs = {}
        for job in sorted(self.sched.holding(), key=lambda j: j.id):
            proc, placement = tracked.get(job.id), self.placements.get(job.id)
            if proc is None or placement is None:
                continue
            gpus = tuple(g for name, gs in placement.parts if name == node.name for g in gs)
            if not gpus:
                continue
            share = placement.share
            mig = ""
            if share.startswith("mig:"):
                profile, _, start = share[4:].partition("@")
                # a MIG device of unknown UUID is still a MIG device (no utilisation to read)
                mig = mig_uuid(self.found, gpus[0], profile, int(start or -1)) or share
            devs[job.id] = JobDevices(gpus, members.get(proc.pid, frozenset()), mig, bool(share) and not mig)
        sample = self.inventory.sample(devs)
        self.gpu_samples = {g.index: g for g in sample.gpus}
        events: list[Event] = []
        for job_id, usage in sorted(sample.jobs.items()):
            # utilisation that cannot be measured (a MIG device) counts as busy: never idle-stopped blind
            util = 100.0 if usage.util_pct is None else float(usage.util_pct)
            rec = self.sampled.setdefault(job_id, {"peak_gpu_mem_mib": 0})
            news, active = self._sample_is_news(self.sched.jobs[job_id], util, usage.mem_used_mib, rec)
            rec.update(t=now, gpu_util_pct=usage.util_pct, gpu_mem_mib=usage.mem_used_mib)
            if news:
                events.append(UsageSample(now, job_id, util, usage.mem_used_mib))
                rec["peak_gpu_mem_mib"] = max(rec["peak_gpu_mem_mib"], usage.mem_used_mib)
                self._logged_active[job_id] = active
        foreign = foreign_processes(sample.gpus, managed)
        for g in range(node.gpus):
            found = foreign.get(g, ())
            self.unmanaged[g] = [{"pid": p.pid, "owner": procs.owner(p.pid), "command": procs.command(p.pid),
                                  "used_mib": p.used_mib, "mig_uuid": p.mig_uuid or None} for p in found]
            flag = bool(found)
            if self.unmanaged_flag.get((node.name, g), False) != flag:
                self.unmanaged_flag[(node.name, g)] = flag
                events.append(GpuUnmanaged(now, node.name, g, flag))
                if flag:
                    log.warning("GPU %d runs processes gpushepherd did not start (%s): not handed out until free", g,
                                ", ".join(f"pid {p['pid']} of {p['owner'] or '?'}" for p in self.unmanaged[g]))
                else:
                    log.info("GPU %d is free of foreign processes again", g)
        return events

    def _sample_is_news(self, job, util: float, mem: int, rec: dict) -> tuple[bool, bool]:
        """Whether a job's sample goes to the log (note 008, "the log stays bounded"):
        its first since this server started, a new peak memory, or its activity crossed
        its class's idle threshold. Returns ``(news, active)``."""
        first = job.id not in self._logged_active
        rose = mem > rec["peak_gpu_mem_mib"]
        rule = job.cls.idle_stop
        if rule is None:  # no idle stop for this class: only memory matters
            return first or rose, True
        threshold = rule.below_util_pct
        active = util >= threshold
        return first or rose or active != self._logged_active.get(job.id), active

    def _limit_s(self, job_id: str) -> float | None:
        """The engine's backstop time limit of a run, seconds: the job's time limit (or
        its class's max runtime) plus its grace period; ``None``: none."""
        job = self.sched.jobs.get(job_id)
        if job is None:
            return None
        limit = job.spec.time_limit_s or job.cls.max_runtime_s
        return None if limit is None else limit + job.cls.grace_period_s

    # ------------------------------------------------------------ views (hold self.lock)
    def job_view(self, job_id: str, row: dict | None = None, history: bool = False) -> dict[str, Any] | None:
        """What ``GET /jobs/{id}`` shows; ``None`` for an unknown job."""
        if job_id in self.arrays:
            return self.array_view(self.arrays[job_id], history=history)
        job = self.sched.jobs.get(job_id)
        if job is None and job_id in self.kept:
            row = row if row is not None else self.store.job_row(job_id)
            return None if row is None else self._kept_view(self.kept[job_id], row, history)
        if job is None and job_id not in self.ended_states:
            return None
        row = row if row is not None else self.store.job_row(job_id)
        if row is None:
            return None
        if job is None:
            rec = self.archived(job_id)
            return None if rec is None else self._archived_view(job_id, rec, row, history)
        spec = job.spec
        pending = job.state is JobState.PENDING
        # a pending job's reason, a rejected one's (Reject's), a preempted one's in its grace
        # period (``Preempted(by job 7, class production-inference)``)
        reason = self.sched.state_reason(job_id)
        factors = self.sched.priority_factors(job_id)
        view = {
            "id": job_id, "state": job.state.value, "class": spec.workload_class, "team": spec.team,
            "user": spec.user, "project": spec.project, "name": spec.name, "gpus": spec.gpus,
            "share": str(spec.share) if spec.share else None,
            "submit_time": spec.submit_time, "first_start": job.first_start, "runs": self.runs[job_id],
            "preemptions": job.preemptions,
            "placement": str(self.placements[job_id]) if job.state.holds_gpus else None,
            "reason": str(reason) if reason is not None else None,
            **self._estimate_view(job_id, pending),
            "priority": factors["priority"], "priority_factors": factors,
            "time_limit_s": job.time_limit_s, "nice": spec.nice,
            "command": json.loads(row["argv"]), "pty": bool(row.get("pty")), "exit_code": row["exit_code"],
            "launch_error": self.launch_errors.get(job_id),
            "lost_runs": len(self.lost.get(job_id, ())),
            **self._failure_view(job_id, next((r.reason for r in self.lost.get(job_id, ()) if r.final), None)),
            **self._usage_view(job), **constraints_view(spec),
            "deadline_at_risk": [list(f) for f in job.deadline_flags],
        }
        if history:
            view["history"] = [{"t": h.t, "from": str(getattr(h.from_state, "value", h.from_state)),
                                "to": str(getattr(h.to_state, "value", h.to_state)), "reason": h.reason}
                               for h in job.history]
            view["cwd"] = row["cwd"]
            view["stdout"], view["stderr"] = row["stdout"], row["stderr"]
            view["checkpoint_dir"] = str(self.backend.checkpoint_dir(job_id))
        return view

    def _end_reason(self, job_id: str) -> list | None:
        """``[reason, detail]`` of the job's last run when it ended for a reason its exit
        code does not say (``OUT_OF_MEMORY``, note 023), else ``None``."""
        rec = self.end_reasons.get(job_id)
        return [rec[1], rec[2]] if rec is not None and rec[0] == self.runs[job_id] else None

    def _failure_view(self, job_id: str, lost: str | None, archived: dict | None = None) -> dict[str, Any]:
        """``end_reason`` (``OUT_OF_MEMORY``; ``None``) and ``failure`` (its detail, else
        the requeue limit's ``lost`` reason) of a job's view; ``archived``: its record."""
        end = archived.get("end_reason") if archived is not None else self._end_reason(job_id)
        return {"end_reason": end[0] if end else None, "failure": f"{end[0]}: {end[1]}" if end else lost}

    def kept_why(self, k: Kept, now: float | None = None) -> str | None:
        """Why kept job ``k`` is not in the core yet (``deps.kept_reason``, or
        ``BadConstraints(...)`` when the policy in force refuses its spec); ``None``: it
        goes to the core at the next step."""
        now = max(self.clock(), self.sched.now) if now is None else now
        why = kept_reason(k, now, self.job_state, self._is_busy)
        if why is None and k.id in self._kept_bad:
            return f"{BAD}({self._kept_bad[k.id]})"
        return why

    def _is_busy(self, name: str, user: str) -> bool:
        """A job named ``name`` of ``user`` is in the core and not ended (``singleton``);
        the core's jobs are read once per step, when a singleton asks."""
        if self._busy is None:
            self._busy = {(j.spec.name, j.spec.user) for j in self.sched.jobs.values()
                          if j.spec.name and not j.state.terminal}
        return (name, user) in self._busy

    def _kept_view(self, k: Kept, row: dict, history: bool) -> dict[str, Any]:
        """``job_view`` of a job the daemon keeps from the core (note 021)."""
        spec = k.spec
        view = {
            "id": k.id, "state": k.state, "class": spec.workload_class, "team": spec.team, "user": spec.user,
            "project": spec.project, "name": spec.name, "gpus": spec.gpus,
            "share": str(spec.share) if spec.share else None, "submit_time": spec.submit_time,
            "first_start": None, "runs": 0, "preemptions": 0, "placement": None,
            "reason": self.kept_why(k) if k.state == "PENDING" else None,
            "estimated_start": None, "estimated_start_basis": None, "priority": None,
            "command": json.loads(row["argv"]), "pty": bool(row.get("pty")), "exit_code": None,
            "launch_error": None, "lost_runs": 0,
            "failure": None, "end_reason": None, **NO_USAGE, **constraints_view(spec), "deadline_at_risk": [],
            "dependency": k.dependency or None, "begin_time": k.begin, "held": k.held,
            "time_limit_s": spec.time_limit_s, "nice": spec.nice, "priority_factors": None,
        }
        if history:
            view["history"] = [{"t": t, "from": a, "to": b, "reason": r} for t, a, b, r in k.history]
            view["cwd"] = row["cwd"]
            view["stdout"], view["stderr"] = row["stdout"], row["stderr"]
            view["checkpoint_dir"] = str(self.backend.checkpoint_dir(k.id))
        return view

    def _estimate_view(self, job_id: str, pending: bool) -> dict[str, Any]:
        """A pending job's planned start (epoch seconds) and what it rests on
        (``estimates`` or ``time limits``: then an upper bound unless jobs that rank higher
        arrive or backfill first; notes 015 section 7, 043); ``None`` when not pending or not plannable."""
        est = self.sched.estimated_starts().get(job_id) if pending else None
        return {"estimated_start": est.t if est is not None else None,
                "estimated_start_basis": est.basis if est is not None else None}

    def _archived_view(self, job_id: str, rec: dict, row: dict, history: bool) -> dict[str, Any]:
        """``job_view`` of a job archived before this server started (note 017): its
        record, as it was when it ended, and its jobs row."""
        spec = rec["spec"]
        share = spec_from_dict(spec).share
        lost = [RunLost(*r) for r in rec.get("lost", [])]
        view = {
            "id": job_id, "state": rec["state"], "class": spec["workload_class"], "team": spec["team"],
            "user": spec["user"], "project": spec.get("project", ""), "name": spec.get("name", ""),
            "gpus": spec["gpus"],
            "share": str(share) if share else None, "submit_time": spec["submit_time"],
            "first_start": rec["first_start"], "runs": rec["runs"], "preemptions": rec["preemptions"],
            "placement": None, "reason": rec["reason"], "estimated_start": None, "estimated_start_basis": None,
            "priority": rec["priority"], "priority_factors": rec.get("priority_factors"),  # absent: an older record
            "time_limit_s": rec.get("time_limit_s", spec.get("time_limit_s")), "nice": spec.get("nice", 0),
            "command": json.loads(row["argv"]), "pty": bool(row.get("pty")), "exit_code": row["exit_code"],
            "launch_error": rec.get("launch_error") or self.launch_errors.get(job_id), "lost_runs": len(lost),
            **self._failure_view(job_id, next((r.reason for r in lost if r.final), None), rec), **rec["usage"],
            **constraints_view(spec_from_dict(spec)), "deadline_at_risk": rec.get("deadline_at_risk", []),
        }
        if history:
            view["history"] = [{"t": t, "from": a, "to": b, "reason": r} for t, a, b, r, _ev in rec["history"]]
            view["cwd"] = row["cwd"]
            view["stdout"], view["stderr"] = row["stdout"], row["stderr"]
            view["checkpoint_dir"] = str(self.backend.checkpoint_dir(job_id))
        return view

    def _usage_view(self, job) -> dict[str, Any]:
        """A job's GPU usage: its last sample as this server took it (utilisation %,
        GPU memory MiB; ``Daemon.sampled``, not logged unless it was news), and what the
        core concluded from the logged samples (``Scheduler.usage_of``, note 009): peak
        memory (MiB, all runs) against the declaration, over it or not, idle since /
        stopped at, and why the job was stopped."""
        rec = self.sampled.get(job.id, {})
        u = self.sched.usage_of(job.id) or {}
        return {"gpu_util_pct": rec.get("gpu_util_pct"), "gpu_mem_mib": rec.get("gpu_mem_mib"),
                "sampled_at": rec.get("t"), "peak_gpu_mem_mib": u.get("peak_mib"),
                "declared_gpu_mem_mib": u.get("declared_mib"), "over_declared_mem": bool(u.get("over_runs")),
                "idle_since": u.get("idle_since"), "idle_stop_at": u.get("idle_stop_at"),
                "stop_reason": u.get("stop_reason")}

    def array_view(self, rec: ArrayRec, history: bool = False) -> dict[str, Any]:
        """An array: the fields of its spec and its progress (chunks done / total,
        running, pending, the indices failed for good and those cancelled, retries used)."""
        p = self._array_progress(rec)
        spec = rec.spec
        share = spec_from_dict(spec).share
        view = {
            "id": rec.id, "array": rec.text, "state": p["state"], "class": spec["workload_class"],
            "team": spec["team"], "user": spec["user"], "project": spec.get("project", ""),
            "name": spec.get("name", ""), "gpus": spec["gpus"],
            "share": str(share) if share else None,
            "submit_time": rec.submit_time, "tasks": p["total"], "done": p["done"], "running": p["running"],
            "pending": p["pending"], "failed_indices": p["failed"], "cancelled_indices": p["cancelled"],
            "retries_used": p["retries_used"],
            "throttle": rec.throttle, "max_retries": rec.max_retries, "cancelled": rec.cancelled is not None,
            "reason": f"{p['done']}/{p['total']} done, "
                      + ("next chunk being submitted" if p["between"] else f"{p['running']} running")
                      + (f", failed {','.join(map(str, p['failed']))}" if p["failed"] else "")
                      + (f", cancelled {','.join(map(str, p['cancelled']))}" if p["cancelled"] else ""),
            "placement": None, "estimated_start": None, "estimated_start_basis": None, "priority": None,
            "command": rec.argv, "exit_code": None,
            "runs": len(rec.indices) - len(rec.todo) + rec.retries, **constraints_view(spec_from_dict(spec)),
        }
        if history:
            view["children"] = {str(i): ids for i, ids in sorted(rec.attempts.items())}
            view["cwd"] = rec.cwd
        return view

    def jobs_view(self, children: bool = False) -> list[dict]:
        """Jobs and arrays in submission order; an array's children only with ``children``."""
        rows = self.store.job_rows()
        out = [(r["num"], j, r) for j, r in rows.items()
               if children or not ((c := parse_child_id(j)) and c[0] in self.arrays)]
        out += [(a.num, a.id, None) for a in self.arrays.values()]
        return self._views([(j, r) for _n, j, r in sorted(out, key=lambda x: x[0])])

    def views_of(self, job_ids: list[str]) -> list[dict]:
        """The views of these jobs and arrays, in this order (unknown ones left out): their
        rows read in one query (a page of ``GET /jobs``, note 029)."""
        rows = self.store.job_rows(ids=[j for j in job_ids if j not in self.arrays])
        return self._views([(j, rows.get(j)) for j in job_ids if j in self.arrays or j in rows])

    def _views(self, entries: list[tuple[str, dict | None]]) -> list[dict]:
        """``job_view`` of each ``(id, row)``; the archived records in one read, not one per job."""
        wanted = [j for j, _r in entries if j not in self.sched.jobs and j in self.ended_states
                  and j not in self._archive]
        extra = self.store.ended_records(wanted) if wanted else {}
        views = []
        for j, r in entries:
            if j in extra:
                views.append(self._archived_view(j, extra[j], r, False))
            else:
                v = self.job_view(j, r)
                if v is not None:
                    views.append(v)
        return views

    def nodes_view(self) -> list[dict]:
        """Each policy node: GPUs, which jobs hold them, this server's inventory; under an
        engine (Slurm) also ``engine``: its state, GPU type, memory (MiB) and labels
        (``None`` for a node the engine does not report; ``engine_error`` when it could
        not be asked)."""
        engine: dict[str, Any] | None = None
        engine_error = None
        if self.backend.kind != "local":
            try:
                engine = {n.name: n for n in self.backend.discover()}
            except BackendError as exc:
                engine_error = str(exc)
        holders: dict[tuple[str, int], list[str]] = {}
        for job in sorted(self.sched.holding(), key=lambda j: j.seq):
            for node, gpus in self.placements[job.id].parts:
                for g in gpus:
                    holders.setdefault((node, g), []).append(job.id)
        out = []
        for node in self.rules.nodes:
            gpus = [{"index": g, "jobs": holders.get((node.name, g), []), **self._gpu_view(node.name, g)}
                    for g in range(node.gpus)]
            view = {"name": node.name, "gpu_type": node.gpu_type, "gpus": node.gpus,
                    "free": sum(1 for g in gpus if not g["jobs"]), "gpu": gpus}
            if self.backend.kind == "local":  # this server runs the jobs of every node it has (note 023)
                view["containment"] = self.backend.containment_view()
            if self.node is not None and node.name == self.node.name and self.found is not None:
                view.update(inventory=self.found.source, driver=self.found.driver or None,
                            cuda=self.found.cuda or None)
            if engine is not None or engine_error:
                e = (engine or {}).get(node.name)
                view["engine"] = None if e is None else {
                    "kind": self.backend.kind, "state": e.state, "gpu_type": e.gpu_type, "gpus": e.gpus,
                    "memory_mib": e.memory_mib, "labels": [f"{k}={v}" if v else k for k, v in e.labels]}
                if engine_error:
                    view["engine_error"] = engine_error
            out.append(view)
        return out

    def _gpu_view(self, node: str, g: int) -> dict[str, Any]:
        """GPU ``g`` of ``node`` as the last sample saw it (this server's node only):
        UUID, utilisation %, memory used / total MiB, temperature C, power W, and the
        foreign processes that make it unmanaged (pid, owner, command, MiB)."""
        mine = self.node is not None and node == self.node.name
        s = self.gpu_samples.get(g) if mine else None
        info = self.found.gpus[g] if mine and self.found is not None and g < len(self.found.gpus) else None
        return {"uuid": (info.uuid or None) if info else None,
                "util_pct": s.util_pct if s else None, "mem_used_mib": s.mem_used_mib if s else None,
                "mem_total_mib": (s.mem_total_mib if s else None) or (info.memory_mib if info else None),
                "temperature_c": s.temperature_c if s else None, "power_w": s.power_w if s else None,
                "unmanaged": self.unmanaged_flag.get((node, g), False),
                "unmanaged_processes": self.unmanaged.get(g, []) if mine else []}

    def usage_view(self) -> dict:
        """What ``GET /usage`` shows: per team GPUs in use (fractions for shares), decayed
        usage in GPU-seconds at the core's time, fair-share factor in [0, 1]; and the
        utilisation % under which a held GPU counts as idle (``/ui``, note 029)."""
        sched = self.sched
        t = sched.now
        used = {row[1] for row in sched.usage.snapshot(t) if row and row[0] == "team"} if t != float("-inf") else set()
        teams = sorted(set(self.rules.teams) | {j.spec.team for j in sched.jobs.values()} | used)
        in_use: Counter = Counter()
        for job in sched.holding():
            in_use[job.spec.team] += job.fraction
        return {"t": t, "idle_threshold_pct": self.metrics.idle_threshold_pct,
                "teams": [{"team": team, "gpus_in_use": in_use[team],
                                   "decayed_usage_gpu_s": sched.usage.value(("team", team), t),
                                   "fair_share_factor": sched.fair_share_factor(team)} for team in teams]}

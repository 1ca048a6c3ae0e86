"""Persistence of the daemon (design note 008): the event log, the jobs table and the
server lock, through SQLAlchemy Core.

The event log is the state: every event the daemon feeds the core is appended here
(and committed) before it is applied. The ``jobs`` table keeps what the core does not
know (command, environment, processes). ``server_lock`` keeps a second server off the
same database. ``api_tokens`` maps the SHA-256 of each API token to a user, teams, an
admin flag, a scope and an expiry (the tokens themselves are never stored). ``audit``
keeps who did what from where (note 023): each row is committed in the transaction of
what it records.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sqlite3
import threading
import time
import uuid
from dataclasses import asdict, dataclass, fields
from operator import itemgetter
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    bindparam,
    create_engine,
    event,
    false,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from gpushepherd.daemon.auth import Principal, digest_matches, new_token, token_hash
from gpushepherd.model.events import (
    Event,
    GpuHealthChanged,
    GpuUnmanaged,
    JobCancelled,
    JobFinished,
    JobRequeueRequested,
    JobSubmitted,
    JobUpdated,
    NodeAdded,
    NodeLost,
    Tick,
    UsageSample,
)
from gpushepherd.model.cluster import Node
from gpushepherd.model.job import ExitStatus, GpuShare, JobSpec
from gpushepherd.model.mig import MigInstance

#: the marker of a database made before Alembic (``meta.schema_version``); the schema's
#: version is now its Alembic revision (``gpushepherd.daemon.migrate``)
SCHEMA_VERSION = 1
#: a lock whose heartbeat is older than this is taken over (seconds)
LOCK_STALE_S = 30.0
#: the ``meta`` key whose value changes at every token created or revoked
TOKENS_VERSION = "tokens_version"

metadata = MetaData()

events = Table(
    "events", metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("batch", Integer, nullable=False, index=True),
    Column("t", Float, nullable=False),
    # policy | submit | exit | cancel | requeue | tick | usage | unmanaged | lost (the daemon's)
    Column("kind", String(32), nullable=False, index=True),
    Column("job_id", String(64), nullable=True),
    Column("payload", Text, nullable=False, default="{}"),
)

#: SQLite's INTEGER holds 64 bits already (its table is left as it is)
RUN_ID = BigInteger().with_variant(Integer, "sqlite")

jobs = Table(
    "jobs", metadata,
    Column("id", String(64), primary_key=True),
    Column("num", Integer, nullable=False, unique=True),  # the numeric id, for ordering
    Column("spec", Text, nullable=False),
    Column("argv", Text, nullable=False),
    Column("shell", Boolean, nullable=False, default=False),
    # no client-side default: rows written without it (older writers, bench/restart.py) take the server's
    Column("pty", Boolean, nullable=False, server_default=false()),  # note 041 (Alembic 0007)
    Column("env", Text, nullable=False, default="{}"),
    Column("cwd", String(4096), nullable=False),
    Column("state", String(16), nullable=False),
    Column("run", Integer, nullable=False, default=0),  # last run launched (0: none)
    # a process id, or an engine run's 60-bit id (Ray actor, pod uid): 64 bits (Alembic 0004)
    Column("pid", RUN_ID, nullable=True),
    Column("pgid", RUN_ID, nullable=True),
    # /proc/<pid>/stat start time (tells a reused pid), a Ray actor id, a pod uid (Alembic 0004)
    Column("proc_start", String(64), nullable=True),
    Column("placement", Text, nullable=True),
    Column("exit_code", Integer, nullable=True),
    Column("kill_at", Float, nullable=True),  # SIGKILL due (epoch seconds) after a SIGTERM
    Column("stdout", String(4096), nullable=True),
    Column("stderr", String(4096), nullable=True),
)

server_lock = Table(
    "server_lock", metadata,
    Column("name", String(16), primary_key=True),
    Column("token", String(64), nullable=False),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("since", Float, nullable=False),
    Column("heartbeat", Float, nullable=False),
)

meta = Table(
    "meta", metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)


arrays = Table(
    "arrays", metadata,  # job arrays (gpushepherd.daemon.arrays); their chunks are ordinary jobs
    Column("id", String(64), primary_key=True),
    Column("num", Integer, nullable=False, unique=True),  # from the jobs' numbering
    Column("array", String(4096), nullable=False),  # as submitted: 0-99%8
    Column("indices", Text, nullable=False),  # JSON list
    Column("throttle", Integer, nullable=False),
    Column("max_retries", Integer, nullable=False),
    Column("submit_time", Float, nullable=False),
    Column("spec", Text, nullable=False),
    Column("argv", Text, nullable=False),
    Column("shell", Boolean, nullable=False, default=False),
    Column("env", Text, nullable=False, default="{}"),
    Column("cwd", String(4096), nullable=False),
    Column("cancelled", Float, nullable=True),
)


services = Table(
    "services", metadata,  # inference services (gpushepherd.daemon.services, note 014); replicas are jobs
    Column("num", Integer, primary_key=True, autoincrement=False),  # from the jobs' numbering
    Column("name", String(64), nullable=False, index=True),  # unique among services not deleted
    Column("created", Float, nullable=False),
    Column("config", Text, nullable=False),  # JSON: spec, command, replicas range, signal, thresholds
    Column("deleted", Float, nullable=True),
)

service_decisions = Table(
    "service_decisions", metadata,  # every scaling decision, committed before it is applied
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("service", Integer, nullable=False, index=True),  # services.num
    Column("t", Float, nullable=False),
    Column("from_replicas", Integer, nullable=False),
    Column("to_replicas", Integer, nullable=False),
    Column("reason", Text, nullable=False),
)


snapshots = Table(
    "snapshots", metadata,  # the daemon's state after a batch (note 017): a restart replays only what follows
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("batch", Integer, nullable=False),  # the last batch it covers
    Column("t", Float, nullable=False),
    Column("payload", Text, nullable=False),  # JSON: the core's snapshot of the jobs not ended, the daemon's state
)

ended_jobs = Table(
    "ended_jobs", metadata,  # jobs in a final state, written once by the snapshot after they ended (note 017)
    Column("id", String(64), primary_key=True),
    Column("state", String(16), nullable=False),
    Column("record", Text, nullable=False),  # JSON: spec, history, runs and the view's fields at the end
    # covering (id, state): a start reads every ended job's state without the records' pages
    Index("ix_ended_jobs_id_state", "id", "state"),
)

idempotency_keys = Table(
    "idempotency_keys", metadata,  # POST /jobs with an Idempotency-Key header (note 017)
    Column("scope", String(300), primary_key=True),  # who: token id, or the user without auth
    Column("key", String(255), primary_key=True),
    Column("body_hash", String(64), nullable=False),  # SHA-256 of the request body
    Column("job_id", String(64), nullable=False),
    Column("created", Float, nullable=False, index=True),
)


api_tokens = Table(
    "api_tokens", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user", String(255), nullable=False),
    Column("teams", Text, nullable=False, default="[]"),  # JSON list
    Column("admin", Boolean, nullable=False, default=False),
    Column("hash", String(64), nullable=False, unique=True),  # SHA-256 hex of the token; never the token
    Column("created", Float, nullable=False),
    Column("revoked", Float, nullable=True),
    Column("expires", Float, nullable=True),  # epoch seconds; NULL: never (Alembic 0006, note 025)
    Column("scope", String(16), nullable=False, server_default="api"),  # api | metrics
)


audit = Table(
    "audit", metadata,  # who did what, from where (note 023, Alembic 0005_audit)
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("t", Float, nullable=False, index=True),  # epoch seconds
    # submit | cancel | hold | release | update | requeue | policy-apply | token-create |
    # token-rotate | token-revoke | token-use | token-refused | service-create | service-delete |
    # attach (denied only, note 041)
    Column("action", String(32), nullable=False),
    Column("user", String(255), nullable=False, index=True),  # who: the token's user (or claimed without tokens)
    Column("token_id", Integer, nullable=True),
    Column("uid", Integer, nullable=True),  # the Unix uid the kernel vouches for (a local command, a local socket)
    Column("address", String(255), nullable=True),  # HOST:PORT of an HTTP client, "local" for a local command
    Column("team", String(255), nullable=True),  # the team the action is about (what a team token may read)
    Column("target", String(255), nullable=True),  # a job id, token id, policy version
    Column("outcome", String(16), nullable=False),  # ok | denied (403) | refused (422, 409) | failed
    Column("detail", Text, nullable=False, default="{}"),  # JSON: what (class, gpus, command, why refused ...)
)

#: the columns of an audit row a caller gives (``seq`` is the database's)
AUDIT_FIELDS = ("t", "action", "user", "token_id", "uid", "address", "team", "target", "outcome", "detail")


def audit_row(t: float, action: str, who: dict | None, outcome: str = "ok", *, team: str | None = None,
              target: str | None = None, detail: dict | None = None) -> dict:
    """An ``audit`` row: ``who`` is ``{"user", "token_id", "uid", "address"}`` (missing
    keys are ``None``/''), ``detail`` any JSON-ready dict."""
    who = who or {}
    return {"t": t, "action": action, "user": str(who.get("user") or "")[:255], "token_id": who.get("token_id"),
            "uid": who.get("uid"), "address": (str(who["address"])[:255] if who.get("address") else None),
            "team": team, "target": None if target is None else str(target)[:255], "outcome": outcome,
            "detail": json.dumps(detail or {}, default=str, separators=(",", ":"))}


#: the most characters of a submission's command an audit row keeps
AUDIT_COMMAND_CHARS = 1000


def audit_command(argv: list[str]) -> str:
    """A command as an audit row's ``detail`` keeps it: JSON, at most
    ``AUDIT_COMMAND_CHARS`` characters (``...`` after a cut)."""
    command = json.dumps(argv)
    return command[:AUDIT_COMMAND_CHARS] + ("..." if len(command) > AUDIT_COMMAND_CHARS else "")


def local_who(command: str) -> dict:
    """``who`` of a command run on this machine (``shepherd token create``): the Unix
    user and uid it runs as, address ``local (COMMAND)``."""
    import pwd

    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return {"user": name, "uid": uid, "address": f"local ({command})"}


class LockHeld(RuntimeError):
    """Another server holds the database; ``str()`` names it and what to do."""


class StorageUnavailable(RuntimeError):
    """The database refused a write or a read (locked past the busy timeout, disk full,
    read-only, unreachable). ``reason`` is one short phrase (``database is locked``);
    ``str()`` adds that nothing was applied and when to retry. The API answers 503
    with ``Retry-After: RETRY_AFTER_S`` (note 017)."""

    RETRY_AFTER_S = 5

    def __init__(self, reason: str, applied: bool = False):
        self.reason = reason
        super().__init__(f"storage unavailable: {reason}; "
                         + ("it may still be applied" if applied else "nothing was applied")
                         + f"; retry in {self.RETRY_AFTER_S} s")


def storage_reason(exc: BaseException) -> str | None:
    """A short phrase for a storage failure (``database is locked``, ``disk full``,
    ``read-only``, ``disk I/O error``, ``database unreachable``), or ``None`` when ``exc``
    is not one (a bug, not the storage)."""
    if isinstance(exc, StorageUnavailable):
        return exc.reason
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    text = str(orig).lower()
    if isinstance(orig, OSError) and not isinstance(orig, sqlite3.Error):
        return {errno.ENOSPC: "disk full", errno.EROFS: "read-only file system", errno.EDQUOT: "disk quota "
                "exceeded", errno.EIO: "disk I/O error"}.get(orig.errno)
    for needle, phrase in (("locked", "database is locked"), ("disk is full", "disk full"),
                           ("readonly", "read-only database"), ("read-only", "read-only database"),
                           ("disk i/o", "disk I/O error"), ("unable to open", "database cannot be opened"),
                           ("no space", "disk full")):
        if needle in text:
            return phrase
    if isinstance(exc, OperationalError) or (isinstance(exc, DBAPIError) and exc.connection_invalidated):
        return "database unreachable" if "connect" in text or "server" in text else \
            f"database error ({type(orig).__name__})"
    return None


@dataclass(frozen=True, slots=True)
class RunLost:
    """A daemon event, logged but never fed to the core (kind ``lost``): run ``run`` of a
    job ended without an exit code (``cause``). ``final``: it was the one past the
    requeue limit and the job is failed with ``reason`` (note 017)."""

    t: float
    job_id: str
    run: int
    cause: str = ""
    final: bool = False
    reason: str = ""


@dataclass(frozen=True, slots=True)
class LaunchFailed:
    """A daemon event, logged but never fed to the core (kind ``launch-error``): run ``run``
    of a job could not be started (``error``: why, as ``show`` / ``why`` print it); logged
    in the batch of the ``FAILED`` exit it causes, so the cause outlives a restart (note 018)."""

    t: float
    job_id: str
    run: int
    error: str = ""


@dataclass(frozen=True, slots=True)
class JobKept:
    """A daemon event, logged but never fed to the core (kind ``keep``): the whole record
    of a job the daemon keeps from the core (dependency, begin time, hold; note 021) as
    ``gpushepherd.daemon.deps.kept_to_dict`` gives it. The last one of a job wins; the
    job's ``submit`` event (its hand-over to the core) ends it."""

    t: float
    job_id: str
    data: dict


@dataclass(frozen=True, slots=True)
class RunEnded:
    """A daemon event, logged but never fed to the core (kind ``ended``): run ``run`` of a
    job ended for ``reason`` (``OUT_OF_MEMORY``), ``detail`` saying how; logged in the
    batch of the exit it explains (note 023)."""

    t: float
    job_id: str
    run: int
    reason: str
    detail: str = ""


#: event kinds only the daemon reads (``Store.batches(daemon=True)``)
DAEMON_KINDS = ("lost", "launch-error", "keep", "ended")
#: their events: logged, never handed to the core
DAEMON_EVENTS = (RunLost, LaunchFailed, JobKept, RunEnded)


# -- events <-> rows -------------------------------------------------------------
_SPEC_FIELDS = tuple(f.name for f in fields(JobSpec))


def spec_to_dict(spec: JobSpec) -> dict:
    """A ``JobSpec`` as the JSON-ready dict the event log stores (a share as its own dict)."""
    # shallow (dataclasses.asdict deep-copies every field: a third of a submission's
    # time in the loop); the share, the one nested dataclass, as a dict; the field
    # names read once (``fields()`` per call was half of this function, note 032)
    d = {name: getattr(spec, name) for name in _SPEC_FIELDS}
    d["share"] = asdict(spec.share) if spec.share is not None else None
    d["gpu_types"] = list(spec.gpu_types)
    d["node_selector"] = [list(p) for p in spec.node_selector]
    d["tolerations"] = list(spec.tolerations)
    return d


def spec_from_dict(d: dict) -> JobSpec:
    """The ``JobSpec`` of a logged dict (``spec_to_dict``); fields absent from an older log
    take their defaults (``project`` ''), so an old log replays unchanged."""
    d = dict(d)
    share = d.pop("share", None)
    d["gpu_types"] = tuple(d.get("gpu_types") or ())
    d["node_selector"] = tuple(tuple(p) for p in d.get("node_selector") or ())
    d["tolerations"] = tuple(d.get("tolerations") or ())
    return JobSpec(**d, share=GpuShare(**share) if share else None)


def event_row(e: Event, spec_text: str | None = None) -> dict:
    """The row of one core event: ``kind``, ``job_id``, JSON ``payload`` (a
    submission's: ``spec_text`` when given, ``spec_to_dict`` of its spec as JSON)."""
    if isinstance(e, JobSubmitted):
        return {"kind": "submit", "job_id": e.spec.id,
                "payload": spec_text if spec_text is not None else json.dumps(spec_to_dict(e.spec))}
    if isinstance(e, JobFinished):
        return {"kind": "exit", "job_id": e.job_id, "payload": json.dumps({"status": e.status.value})}
    if isinstance(e, JobCancelled):
        return {"kind": "cancel", "job_id": e.job_id, "payload": "{}"}
    if isinstance(e, JobRequeueRequested):
        return {"kind": "requeue", "job_id": e.job_id, "payload": "{}"}
    if isinstance(e, JobUpdated):  # scontrol update (note 039)
        return {"kind": "update", "job_id": e.job_id,
                "payload": json.dumps({"time_limit_s": e.time_limit_s, "nice": e.nice, "admin": e.admin})}
    if isinstance(e, Tick):
        return {"kind": "tick", "job_id": None, "payload": "{}"}
    if isinstance(e, UsageSample):  # GPU samples (note 008 "GPU inventory and samples")
        return {"kind": "usage", "job_id": e.job_id,
                "payload": json.dumps({"gpu_util_pct": e.gpu_util_pct, "mem_used_mib": e.mem_used_mib})}
    if isinstance(e, GpuUnmanaged):
        return {"kind": "unmanaged", "job_id": None,
                "payload": json.dumps({"node": e.node, "gpu": e.gpu, "unmanaged": e.unmanaged})}
    if isinstance(e, NodeLost):  # an engine's node gone or NotReady (note 016)
        return {"kind": "node-lost", "job_id": None, "payload": json.dumps({"node": e.node})}
    if isinstance(e, NodeAdded) and e.node is not None:  # ... and back
        return {"kind": "node-added", "job_id": None, "payload": json.dumps({"node": node_to_dict(e.node)})}
    if isinstance(e, GpuHealthChanged):
        return {"kind": "gpu-health", "job_id": None,
                "payload": json.dumps({"node": e.node, "gpu": e.gpu, "healthy": e.healthy})}
    if isinstance(e, RunLost):  # a daemon event (note 017)
        return {"kind": "lost", "job_id": e.job_id,
                "payload": json.dumps({"run": e.run, "cause": e.cause, "final": e.final, "reason": e.reason})}
    if isinstance(e, LaunchFailed):
        return {"kind": "launch-error", "job_id": e.job_id, "payload": json.dumps({"run": e.run, "error": e.error})}
    if isinstance(e, JobKept):  # a kept job's record (note 021)
        return {"kind": "keep", "job_id": e.job_id, "payload": json.dumps(e.data)}
    if isinstance(e, RunEnded):  # why a run ended (note 023)
        return {"kind": "ended", "job_id": e.job_id,
                "payload": json.dumps({"run": e.run, "reason": e.reason, "detail": e.detail})}
    raise TypeError(f"event {type(e).__name__} is not logged by the daemon")


def node_to_dict(node: Node) -> dict:
    """A ``Node`` as JSON-ready data (``node_from_dict`` reads it back)."""
    d = asdict(node)
    d["mig"] = [[g, [asdict(m) for m in layout]] for g, layout in node.mig]
    return d


def node_from_dict(d: dict) -> Node:
    """The ``Node`` of ``node_to_dict``'s data."""
    d = dict(d)
    d["labels"] = tuple(tuple(p) for p in d.get("labels") or ())
    d["nvlink_islands"] = tuple(tuple(i) for i in d.get("nvlink_islands") or ())
    for k in ("gpu_uuids", "taints", "cached"):
        d[k] = tuple(d.get(k) or ())
    d["mig"] = tuple((int(g), tuple(MigInstance(**m) for m in layout)) for g, layout in d.get("mig") or ())
    return Node(**d)


def event_from_row(t: float, kind: str, job_id: str | None, payload: str) -> Event:
    """The core's event of one ``events`` row (``kind``, ``t`` in epoch seconds, ``job_id``,
    JSON ``payload``).

    Raises:
        ValueError: an unknown ``kind`` (a log written by a newer gpushepherd)."""
    data = json.loads(payload)
    if kind == "submit":
        return JobSubmitted(t, spec_from_dict(data))
    if kind == "exit":
        return JobFinished(t, job_id, ExitStatus(data["status"]))
    if kind == "cancel":
        return JobCancelled(t, job_id)
    if kind == "requeue":
        return JobRequeueRequested(t, job_id)
    if kind == "update":
        return JobUpdated(t, job_id, data.get("time_limit_s"), data.get("nice"), bool(data.get("admin", True)))
    if kind == "tick":
        return Tick(t)
    if kind == "usage":
        return UsageSample(t, job_id, float(data["gpu_util_pct"]), int(data["mem_used_mib"]))
    if kind == "unmanaged":
        return GpuUnmanaged(t, data["node"], int(data["gpu"]), bool(data["unmanaged"]))
    if kind == "node-lost":
        return NodeLost(t, data["node"])
    if kind == "node-added":
        return NodeAdded(t, node_from_dict(data["node"]))
    if kind == "gpu-health":
        return GpuHealthChanged(t, data["node"], int(data["gpu"]), bool(data["healthy"]))
    if kind == "lost":
        return RunLost(t, job_id, int(data["run"]), str(data.get("cause", "")), bool(data.get("final")),
                       str(data.get("reason", "")))
    if kind == "launch-error":
        return LaunchFailed(t, job_id, int(data["run"]), str(data.get("error", "")))
    if kind == "keep":
        return JobKept(t, job_id, data)
    if kind == "ended":
        return RunEnded(t, job_id, int(data["run"]), str(data.get("reason", "")), str(data.get("detail", "")))
    raise ValueError(f"event log: kind {kind!r} is not allowed: policy, submit, exit, cancel, requeue, tick, usage, "
                     f"unmanaged, node-lost, node-added, gpu-health, lost, launch-error, keep or ended")


@contextlib.contextmanager
def _opening(sqlite_url: str | None):
    """Serialise the first connection and migration of one SQLite file across threads and
    processes (``flock`` on ``<file>.open-lock`` beside it): two at once could both try to
    switch a fresh file to WAL, and one got "database is locked" past its busy timeout
    (seen in CI: tests/test_migrations.py, four openers at once). No-op for PostgreSQL and
    in-memory SQLite."""
    from sqlalchemy.engine import make_url

    path = make_url(sqlite_url).database if sqlite_url else None
    if not path or path == ":memory:" or path.startswith("file:"):
        yield
        return
    import fcntl

    with open(f"{path}.open-lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _sqlite_pragmas(synchronous: str, busy_timeout_s: float = 30.0):
    """A connect hook: a busy timeout (seconds), WAL, ``synchronous`` (FULL: an acknowledged event survives a
    power cut; NORMAL: a commit survives a crash of the process, and the next FULL
    commit makes it durable too)."""
    def hook(dbapi_conn, _record):  # noqa: ANN001
        cur = dbapi_conn.cursor()
        # the busy timeout first: switching a fresh database to WAL needs its lock, and
        # without the timeout a second process opening it at once fails at that pragma
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.close()
    return hook


def _policy_payload(payload: str) -> tuple[dict, dict]:
    """``(policy, applied)`` of a logged policy event; a log written before policy
    versions holds the bare policy (``applied`` is then ``{}``)."""
    data = json.loads(payload)
    if isinstance(data, dict) and set(data) == {"policy", "applied"}:  # "policy" is no policy file key
        return data["policy"], data["applied"]
    return data, {}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Store:
    """The daemon's database.

    Args:
        url: a SQLAlchemy URL (``sqlite:////path/shepherd.db``,
            ``postgresql+psycopg://user@host/db``). SQLite gets WAL journaling,
            ``synchronous=FULL`` and a busy timeout; PostgreSQL runs at its default
            isolation (READ COMMITTED) with its default durability (``synchronous_commit``
            on), its connections checked before use.
        busy_timeout_s: SQLite: how long a statement waits for another writer's lock
            before failing with "database is locked" (seconds, default 30).

    Raises:
        SchemaError: the database cannot be brought to this code's schema revision
            (``gpushepherd.daemon.migrate.upgrade``): a newer revision, foreign tables,
            or an upgrade due under a running server.
    """

    def __init__(self, url: str, busy_timeout_s: float = 30.0):
        self.url = url
        sqlite = url.startswith("sqlite")
        self.engine: Engine = create_engine(url, future=True, **({} if sqlite else {"pool_pre_ping": True}))
        # writes of the jobs table alone (states, run attempts, pids, exit codes) go without an
        # fsync of their own: they survive a crash of the server, and a power cut ends the jobs
        # they describe anyway (note 008, "Submission throughput"); PostgreSQL: SET LOCAL per transaction
        self._lazy: Engine = self.engine
        if self.engine.dialect.name == "sqlite":
            self._lazy = create_engine(url, future=True)
            for engine, sync in ((self.engine, "FULL"), (self._lazy, "NORMAL")):
                event.listen(engine, "connect", _sqlite_pragmas(sync, busy_timeout_s))
        #: storage failures seen by any statement, commit or connect of this store, by
        #: ``storage_reason`` (``/metrics``: ``gpushepherd_store_errors_total``, note 019)
        self.errors: dict[str, int] = {}
        #: the last one: (``time.monotonic()`` seconds, reason); ``None``: none yet
        self.last_error: tuple[float, str] | None = None
        self._errors_lock = threading.Lock()
        for engine in {self.engine, self._lazy}:
            event.listen(engine, "handle_error", self._count_error)
        from gpushepherd.daemon.migrate import upgrade

        try:
            with _opening(url if sqlite else None):
                self.revision_before, self.revision = upgrade(self.engine, self.display_url, LOCK_STALE_S)
        except BaseException:
            self.engine.dispose()
            self._lazy.dispose()
            raise
        self.token = uuid.uuid4().hex
        self._batch = self._last_batch()
        self._tokens_cache: tuple[str | None, list, bool] | None = None  # version, active, ever had one
        self._compiled: dict[tuple, tuple[str, Any]] = {}  # see _executemany
        self._spec_texts: dict[int, tuple[JobSpec, str]] = {}  # see spec_text
        self._tv_lock = threading.Lock()
        self._tv_conn = None  # tokens_version's own DBAPI connection
        self._tv_sql = "SELECT value FROM meta WHERE key = " + ("?" if self.engine.dialect.paramstyle == "qmark"
                                                                else "%s")

    def _count_error(self, ctx) -> None:
        """``handle_error`` hook: count a storage failure (not a constraint violation or a
        bug: ``storage_reason`` is ``None`` for those); the error is raised as before."""
        reason = storage_reason(ctx.sqlalchemy_exception or ctx.original_exception)
        if reason is not None:
            with self._errors_lock:
                self.errors[reason] = self.errors.get(reason, 0) + 1
                self.last_error = (time.monotonic(), reason)

    def ping(self) -> bool:
        """One primary-key read on a pooled connection (the server-lock row): the
        database answers a query; returns whether this store still holds the lock
        (readiness, note 019).

        Raises:
            SQLAlchemyError: the database does not answer (``storage_reason`` names why).
        """
        with self.engine.connect() as c:
            token = c.execute(select(server_lock.c.token).where(server_lock.c.name == "server")).scalar()
        return token == self.token

    @property
    def display_url(self) -> str:
        """The URL without its password, for messages."""
        return self.engine.url.render_as_string(hide_password=True)

    def close(self) -> None:
        """Close the pooled connections (the lock is released by ``release_lock``)."""
        with self._tv_lock:
            if self._tv_conn is not None:  # discarded, not pooled: it is in autocommit on PostgreSQL
                self._tv_conn.invalidate()
                self._tv_conn = None
        self.engine.dispose()
        self._lazy.dispose()

    @staticmethod
    def sqlite_url(data_dir: Path) -> str:
        """The default database: ``sqlite:///<data_dir>/shepherd.db`` (absolute path)."""
        return f"sqlite:///{Path(data_dir).resolve() / 'shepherd.db'}"

    # -- the lock -------------------------------------------------------------
    def acquire_lock(self, now: float) -> None:
        """Become the one server of this database.

        Raises:
            LockHeld: another server holds it (alive, or its heartbeat is fresh).
        """
        host, pid = socket.gethostname(), os.getpid()
        row = dict(token=self.token, host=host, pid=pid, since=now, heartbeat=now)
        try:
            self._acquire(now, host, pid, row)
        except IntegrityError:  # the row was inserted by another server between our read and our insert
            raise LockHeld(f"database {self.display_url}: another gpushepherd server took the lock at the same "
                           f"moment") from None

    def _acquire(self, now: float, host: str, pid: int, row: dict) -> None:
        with self.engine.begin() as c:
            # FOR UPDATE (PostgreSQL; SQLite has one writer anyway): a second server starting
            # at this moment waits for this transaction, then reads what it wrote
            held = c.execute(select(server_lock).where(server_lock.c.name == "server")
                             .with_for_update()).mappings().first()
            if held is None:
                c.execute(insert(server_lock).values(name="server", **row))
                return
            dead = held["host"] == host and not _pid_alive(held["pid"])
            stale = now - held["heartbeat"] > LOCK_STALE_S
            if not (dead or stale):
                raise LockHeld(
                    f"database {self.display_url}: another gpushepherd server "
                    f"holds it (pid {held['pid']} on host {held['host']}, since "
                    f"{time.strftime('%Y-%m-%d %H:%M:%S %Z', time.localtime(held['since']))}, last seen "
                    f"{now - held['heartbeat']:.0f} s ago); stop that server first - only one server may use "
                    f"a database (a dead server's lock is taken over after {LOCK_STALE_S:.0f} s)")
            # compare-and-swap on the old token: two servers starting at once cannot both win
            res = c.execute(update(server_lock).where(server_lock.c.name == "server",
                                                      server_lock.c.token == held["token"]).values(**row))
            if res.rowcount != 1:
                raise LockHeld(f"database {self.display_url}: another gpushepherd server took the lock at the "
                               f"same moment")

    def heartbeat(self, now: float) -> bool:
        """Refresh the lock; ``False`` if another server has taken it over."""
        with self.engine.begin() as c:
            res = c.execute(update(server_lock).where(server_lock.c.name == "server",
                                                      server_lock.c.token == self.token).values(heartbeat=now))
            return res.rowcount == 1

    def release_lock(self) -> None:
        """Give up the server lock row if this store holds it (no-op otherwise)."""
        with self.engine.begin() as c:
            c.execute(server_lock.delete().where(server_lock.c.name == "server", server_lock.c.token == self.token))

    # -- the event log ----------------------------------------------------------
    def _last_batch(self) -> int:
        with self.engine.connect() as c:
            return c.execute(select(func.max(events.c.batch))).scalar() or 0

    def append(self, t: float, batch: list[Event], jobs_rows: list[dict] = (), array_rows: list[dict] = (),
               job_updates: dict[str, dict[str, Any]] | None = None, idempotency: list[dict] = (),
               audit_rows: list[dict] = ()) -> int:
        """Commit one batch (the events of one ``Scheduler.handle`` call at ``t``, and
        daemon events such as ``RunLost``) and, in the same transaction, new rows of the
        jobs and arrays tables, updates of jobs rows (``job_updates``: job id -> column
        values, e.g. the exit codes the batch's exit events report), the
        ``idempotency_keys`` rows of its submissions and the ``audit`` rows of what it
        records (``audit_row``). Returns the batch number.

        Raises:
            SQLAlchemyError: the commit failed; nothing of it is in the database.
        """
        self._batch += 1
        with self.engine.begin() as c:
            if array_rows:
                c.execute(insert(arrays), list(array_rows))
            cur = c.connection.cursor()  # the hot inserts: statements compiled once (notes 008, 032)
            try:
                if idempotency:
                    self._executemany(cur, "idempotency+", lambda: insert(idempotency_keys), list(idempotency))
                if audit_rows:
                    self._executemany(cur, "audit+", lambda: insert(audit), list(audit_rows))
                if jobs_rows:
                    self._executemany(cur, "jobs+", lambda: insert(jobs), list(jobs_rows))
                if batch:
                    b = self._batch
                    self._executemany(cur, "events+", lambda: insert(events),
                                      [dict(batch=b, t=t, **event_row(e, self.spec_text(e.spec) if isinstance(
                                          e, JobSubmitted) else None)) for e in batch])
                if job_updates:
                    self._update_jobs_on(cur, job_updates)
            finally:
                cur.close()
                self._spec_texts.clear()
        return self._batch

    def spec_text(self, spec: JobSpec) -> str:
        """``spec_to_dict(spec)`` as JSON text, encoded once per ``JobSpec`` object
        until the next ``append``: a submission's jobs row (``spec``) and its event's
        payload are the same text (note 060). Loop thread only."""
        hit = self._spec_texts.get(id(spec))
        if hit is not None and hit[0] is spec:  # the object itself (frozen), not one that reused its id
            return hit[1]
        text = json.dumps(spec_to_dict(spec))
        self._spec_texts[id(spec)] = (spec, text)
        return text

    def _executemany(self, cur, name: str, build, params: list[dict]) -> None:
        """The statement ``build()`` (an INSERT or UPDATE of the columns of
        ``params[0]``; an UPDATE's ``WHERE`` binds ``_id``) on the DBAPI cursor ``cur``,
        for every dict of ``params``, built and compiled once per ``name`` and set of
        columns: SQLAlchemy's statement building and compiling cost more than SQLite's
        work here."""
        keys = tuple(params[0])
        key = (name, keys)
        compiled = self._compiled.get(key)
        if compiled is None:
            c = build().compile(dialect=self.engine.dialect, column_keys=[k for k in keys if k != "_id"])
            order = tuple(c.positiontup) if c.positional else None
            # a row's values in the statement's order: one C call per row (note 060)
            getter = None if order is None else itemgetter(*order) if len(order) > 1 \
                else (lambda p, k=order[0]: (p[k],))
            compiled = self._compiled[key] = (str(c), getter)
        sql, getter = compiled
        cur.executemany(sql, list(map(getter, params)) if getter is not None else params)

    def append_policy(self, t: float, raw: dict, by: str = "", source: str = "", audit_rows: list[dict] = ()) -> None:
        """Log a policy (parsed YAML) taking effect at ``t``, applied by user ``by`` from
        file ``source``, with its ``audit`` rows in the same transaction. Its version is
        its ordinal among the logged policies."""
        self._batch += 1
        payload = {"policy": raw, "applied": {"by": by, "source": source}}
        with self.engine.begin() as c:
            c.execute(insert(events).values(batch=self._batch, t=t, kind="policy", job_id=None,
                                            payload=json.dumps(payload, sort_keys=True)))
            if audit_rows:
                c.execute(insert(audit), list(audit_rows))

    # -- the audit log (note 023) -----------------------------------------------------
    def write_audit(self, rows: list[dict]) -> None:
        """Commit ``audit`` rows of their own (``audit_row``; no other write to join).

        Raises:
            SQLAlchemyError: none of them was written.
        """
        if rows:
            with self.engine.begin() as c:
                c.execute(insert(audit), list(rows))

    def audit_entries(self, since: float | None = None, users: list[str] | None = None,
                      teams: list[str] | None = None, actions: list[str] | None = None,
                      limit: int = 1000) -> list[dict]:
        """The newest ``limit`` audit rows at or after ``since`` (epoch seconds), of
        ``users`` (who acted), about ``teams`` and of ``actions`` (``None``: any), oldest
        first; ``detail`` decoded."""
        q = select(audit)
        if since is not None:
            q = q.where(audit.c.t >= since)
        if users is not None:
            q = q.where(audit.c.user.in_(users))
        if teams is not None:
            q = q.where(audit.c.team.in_(teams))
        if actions is not None:
            q = q.where(audit.c.action.in_(actions))
        with self.engine.connect() as c:
            rows = c.execute(q.order_by(audit.c.seq.desc()).limit(limit)).mappings().all()
        return [{**dict(r), "detail": json.loads(r["detail"] or "{}")} for r in reversed(rows)]

    def last_policy(self) -> dict | None:
        """The last logged policy (parsed YAML as a dict), or ``None`` when none is logged."""
        with self.engine.connect() as c:
            row = c.execute(select(events.c.payload).where(events.c.kind == "policy")
                            .order_by(events.c.seq.desc()).limit(1)).first()
        return _policy_payload(row[0])[0] if row else None

    def policy_history(self) -> list[dict]:
        """Every logged policy, oldest first: ``version`` (1, 2, ...), ``t`` (epoch
        seconds it took effect), ``by``, ``source``, ``policy`` (the parsed YAML)."""
        with self.engine.connect() as c:
            rows = c.execute(select(events.c.t, events.c.payload).where(events.c.kind == "policy")
                             .order_by(events.c.seq)).all()
        out = []
        for version, (t, payload) in enumerate(rows, start=1):
            raw, applied = _policy_payload(payload)
            out.append({"version": version, "t": t, "by": applied.get("by", ""),
                        "source": applied.get("source", ""), "policy": raw})
        return out

    def batches(self, daemon: bool = False, after: int = 0, until: int | None = None):
        """Yield the log as ``(t, "policy", raw dict)`` or ``(t, "events", [Event, ...])``,
        one item per batch, in order: the batches numbered above ``after`` (and at most
        ``until``). ``daemon``: also the daemon's own events (``RunLost``), which the
        core never sees; without it they are skipped (``report``, the dashboard)."""
        q = select(events.c.batch, events.c.t, events.c.kind, events.c.job_id, events.c.payload)
        if after:
            q = q.where(events.c.batch > after)
        if until is not None:
            q = q.where(events.c.batch <= until)
        with self.engine.connect() as c:
            rows = c.execute(q.order_by(events.c.seq)).all()
        cur, t, out = None, 0.0, []
        for b, bt, kind, job_id, payload in rows:
            if b != cur and out:
                yield t, "events", out
                out = []
            cur, t = b, bt
            if kind == "policy":
                yield bt, "policy", _policy_payload(payload)[0]
            elif daemon or kind not in DAEMON_KINDS:
                out.append(event_from_row(bt, kind, job_id, payload))
        if out:
            yield t, "events", out

    @property
    def last_batch(self) -> int:
        """The number of the last batch this store committed (or found at open)."""
        return self._batch

    # -- snapshots and ended jobs (note 017) ------------------------------------------
    def last_snapshot(self) -> tuple[int, float, dict] | None:
        """The newest snapshot: ``(last batch it covers, t, payload)``, or ``None``."""
        with self.engine.connect() as c:
            row = c.execute(select(snapshots.c.batch, snapshots.c.t, snapshots.c.payload)
                            .order_by(snapshots.c.seq.desc()).limit(1)).first()
        return (row[0], row[1], json.loads(row[2])) if row else None

    def write_snapshot(self, batch: int, t: float, payload: dict, ended: list[dict], keep: int = 2) -> None:
        """Commit a snapshot covering the log up to ``batch`` and, in the same
        transaction, the ``ended_jobs`` rows (``id``, ``state``, ``record`` JSON) of the
        jobs that ended since the previous one; older snapshots beyond the newest
        ``keep`` are deleted.

        Raises:
            SQLAlchemyError: nothing of it was written.
        """
        with self.engine.begin() as c:
            if ended:
                c.execute(insert(ended_jobs), ended)
            c.execute(insert(snapshots).values(batch=batch, t=t, payload=json.dumps(payload, separators=(",", ":"))))
            seqs = [r[0] for r in c.execute(select(snapshots.c.seq).order_by(snapshots.c.seq.desc()))]
            if len(seqs) > keep:
                c.execute(snapshots.delete().where(snapshots.c.seq <= seqs[keep]))
        if self.engine.dialect.name == "sqlite":  # a small WAL: a restart after kill -9 recovers it fast
            try:
                with self.engine.connect() as c:
                    c.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            except OperationalError:
                pass  # readers in the way: the next automatic checkpoint does it

    def archive_jobs(self, rows: list[dict]) -> None:
        """Commit ``ended_jobs`` rows (``id``, ``state``, ``record`` JSON) ahead of the
        snapshot that will cover them (a long first archive, in chunks).

        Raises:
            SQLAlchemyError: none of them was written.
        """
        with self.engine.begin() as c:
            c.execute(insert(ended_jobs), rows)

    def ended_states(self) -> dict[str, str]:
        """Job id -> final state of every job in ``ended_jobs``."""
        with self.engine.connect() as c:
            return dict(c.execute(select(ended_jobs.c.id, ended_jobs.c.state)).all())

    def ended_records(self, ids: list[str] | None = None) -> dict[str, dict]:
        """Job id -> the archived record (spec, history, view fields) of the jobs
        ``ids`` (``None``: all)."""
        q = select(ended_jobs.c.id, ended_jobs.c.record)
        out = {}
        with self.engine.connect() as c:
            if ids is None:
                rows = c.execute(q).all()
            else:
                rows = []
                ids = list(ids)
                for i in range(0, len(ids), 500):  # bounded IN lists
                    rows += c.execute(q.where(ended_jobs.c.id.in_(ids[i:i + 500]))).all()
        for job_id, record in rows:
            out[job_id] = json.loads(record)
        return out

    # -- idempotency keys (note 017) ---------------------------------------------
    def idempotency_get(self, scope: str, key: str) -> tuple[str, str] | None:
        """``(body hash, job id)`` of an ``Idempotency-Key`` committed for ``scope``, or ``None``."""
        with self.engine.connect() as c:
            row = c.execute(select(idempotency_keys.c.body_hash, idempotency_keys.c.job_id).where(
                idempotency_keys.c.scope == scope, idempotency_keys.c.key == key)).first()
        return (row[0], row[1]) if row else None

    def idempotency_prune(self, before: float) -> int:
        """Forget the idempotency keys committed before ``before`` (epoch seconds);
        returns how many."""
        with self.engine.begin() as c:
            return c.execute(idempotency_keys.delete().where(idempotency_keys.c.created < before)).rowcount

    # -- jobs -------------------------------------------------------------------
    def next_job_number(self) -> int:
        """The next free numeric job id (one more than any job, array or service so far)."""
        with self.engine.connect() as c:
            return max(c.execute(select(func.max(jobs.c.num))).scalar() or 0,
                       c.execute(select(func.max(arrays.c.num))).scalar() or 0,
                       c.execute(select(func.max(services.c.num))).scalar() or 0) + 1

    def array_rows(self) -> list[dict]:
        """Every array's row, in submission order."""
        with self.engine.connect() as c:
            return [dict(r) for r in c.execute(select(arrays).order_by(arrays.c.num)).mappings()]

    def cancel_array(self, array_id: str, t: float) -> None:
        """Record that array ``array_id`` was cancelled at ``t`` (epoch seconds), committed."""
        with self.engine.begin() as c:
            c.execute(update(arrays).where(arrays.c.id == array_id, arrays.c.cancelled.is_(None))
                      .values(cancelled=t))

    def job_row(self, job_id: str) -> dict | None:
        """The ``jobs`` row of ``job_id`` as a dict, or ``None`` for an unknown job."""
        with self.engine.connect() as c:
            row = c.execute(select(jobs).where(jobs.c.id == job_id)).mappings().first()
        return dict(row) if row else None

    def job_rows(self, ids: list[str] | None = None, not_in_states: tuple[str, ...] = ()) -> dict[str, dict]:
        """``jobs`` rows, as ``{job id: row dict}`` in job number order: every row, or
        those of ``ids``, or (``not_in_states``) those whose state column is none of
        these."""
        q = select(jobs).order_by(jobs.c.num)
        if not_in_states:
            q = q.where(jobs.c.state.not_in(list(not_in_states)))
        with self.engine.connect() as c:
            if ids is None:
                return {r["id"]: dict(r) for r in c.execute(q).mappings()}
            out, ids = {}, list(ids)
            for i in range(0, len(ids), 500):
                out.update({r["id"]: dict(r) for r in c.execute(q.where(jobs.c.id.in_(ids[i:i + 500]))).mappings()})
            return out

    def job_numbers(self, after: int = 0) -> list[tuple[int, str]]:
        """``(number, id)`` of every job and array numbered above ``after``, by number
        (the pages of ``GET /jobs``, note 029: one read of the unique ``num`` indexes)."""
        with self.engine.connect() as c:
            rows = c.execute(select(jobs.c.num, jobs.c.id).where(jobs.c.num > after)).all()
            rows += c.execute(select(arrays.c.num, arrays.c.id).where(arrays.c.num > after)).all()
        return sorted((int(n), j) for n, j in rows)

    def job_ids(self, containing: str = "") -> list[str]:
        """Job ids (no other column: cheap at a start), in job number order; only those
        containing ``containing`` when given (``_``: array children, ``.``: service
        replicas), filtered by the database and then in no particular order (the id
        index alone answers it)."""
        q = select(jobs.c.id)
        if containing:
            q = q.where(jobs.c.id.contains(containing, autoescape=True))
        else:
            q = q.order_by(jobs.c.num)
        with self.engine.connect() as c:
            return list(c.execute(q).scalars())

    def update_job(self, job_id: str, **values: Any) -> None:
        """Set columns of one ``jobs`` row (no fsync of its own: note 008, "Submission
        throughput")."""
        with self.engine.begin() as c:
            c.execute(update(jobs).where(jobs.c.id == job_id).values(**values))

    # -- API tokens (gpushepherd.daemon.auth) -------------------------------------
    def create_token(self, user: str, teams: list[str], admin: bool = False, expires: float | None = None,
                     scope: str = "api", who: dict | None = None) -> tuple[int, str]:
        """A new token for ``user``; returns ``(id, token)``. ``expires``: epoch seconds
        (``None``: never); ``scope``: ``api`` or ``metrics`` (``/metrics`` only). Only the
        token's hash is stored: the caller shows the token once. Bumps the tokens
        version and writes its ``token-create`` audit row (``who`` made it: ``local_who``
        of this process by default; note 023) in the same transaction (``tokens_version``)."""
        token = new_token()
        who = who or local_who("shepherd token create")

        def write(c):
            token_id = self._insert_token(c, token, user, teams, admin, expires, scope)
            c.execute(insert(audit).values(**audit_row(time.time(), "token-create", who, target=str(token_id), detail={
                "token": token_id, "for_user": user, "teams": list(teams), "admin": bool(admin), "scope": scope,
                "expires": expires})))
            return token_id
        return self._token_change(write), token

    @staticmethod
    def _insert_token(c, token: str, user: str, teams, admin: bool, expires: float | None, scope: str) -> int:
        res = c.execute(insert(api_tokens).values(user=user, teams=json.dumps(list(teams)), admin=admin,
                                                  hash=token_hash(token), created=time.time(), expires=expires,
                                                  scope=scope))
        return res.inserted_primary_key[0]

    def rotate_token(self, token_id: int, who: dict | None = None) -> tuple[int, str, dict] | None:
        """Replace token ``token_id`` by a new secret with the same user, teams, admin
        flag, scope and lifetime (``expires - created``, counted from now; none: none),
        and revoke it, in one transaction with its ``token-rotate`` audit row (``who``:
        ``local_who`` by default; note 023). Returns ``(new id, token, new row without
        the hash)``, or ``None`` when there is no such token or it was revoked (note 025)."""
        token = new_token()
        who = who or local_who("shepherd token rotate")

        def write(c):
            old = c.execute(select(api_tokens).where(api_tokens.c.id == token_id, api_tokens.c.revoked.is_(None))
                            ).mappings().first()
            if old is None:
                return False
            now = time.time()
            if c.execute(update(api_tokens).where(api_tokens.c.id == token_id, api_tokens.c.revoked.is_(None))
                         .values(revoked=now)).rowcount != 1:
                return False  # revoked in between
            expires = None if old["expires"] is None else now + (old["expires"] - old["created"])
            new_id = self._insert_token(c, token, old["user"], json.loads(old["teams"]), bool(old["admin"]),
                                        expires, old["scope"])
            c.execute(insert(audit).values(**audit_row(now, "token-rotate", who, target=str(new_id), detail={
                "token": new_id, "replaces": token_id, "for_user": old["user"]})))
            return new_id, {"id": new_id, "user": old["user"], "teams": json.loads(old["teams"]),
                            "admin": bool(old["admin"]), "scope": old["scope"], "expires": expires}
        out = self._token_change(write)
        return None if out is False else (out[0], token, out[1])

    def tokens(self) -> list[dict]:
        """Every token's row (revoked ones too), without the hashes."""
        with self.engine.connect() as c:
            rows = c.execute(select(api_tokens).order_by(api_tokens.c.id)).mappings().all()
        return [{**{k: v for k, v in r.items() if k != "hash"}, "teams": json.loads(r["teams"])} for r in rows]

    def revoke_token(self, token_id: int, who: dict | None = None) -> bool:
        """Revoke a token; ``False`` if there is no such token (or it was revoked).
        Bumps the tokens version and writes its ``token-revoke`` audit row (``who``:
        ``local_who`` by default) in the same transaction."""
        who = who or local_who("shepherd token revoke")

        def write(c):
            now = time.time()
            res = c.execute(update(api_tokens).where(api_tokens.c.id == token_id, api_tokens.c.revoked.is_(None))
                            .values(revoked=now))
            if res.rowcount != 1:
                return False
            c.execute(insert(audit).values(**audit_row(now, "token-revoke", who, target=str(token_id),
                                                       detail={"token": token_id})))
            return True
        return self._token_change(write)

    def _token_change(self, write):
        """Run ``write(connection)`` and, unless it returns ``False`` (nothing changed),
        give ``meta.tokens_version`` a new random value in the same transaction (note 008, "Submission throughput": the API's token
        cache is keyed by it). Two first writers inserting the row at once: the loser
        is retried, as an update."""
        for attempt in range(2):
            try:
                with self.engine.begin() as c:
                    out = write(c)
                    if out is False:  # nothing changed (a revoke of no active token)
                        return out
                    stamp = uuid.uuid4().hex
                    if c.execute(update(meta).where(meta.c.key == TOKENS_VERSION).values(value=stamp)).rowcount == 0:
                        c.execute(insert(meta).values(key=TOKENS_VERSION, value=stamp))
                    return out
            except IntegrityError:
                if attempt:
                    raise

    def tokens_version(self) -> str | None:
        """``meta.tokens_version``: a new value at every token created or revoked
        (``None``: never, on this database). One primary-key read on a connection of
        its own, kept open, in autocommit (it sees every commit made before the call,
        from any process); a broken connection is replaced once."""
        with self._tv_lock:
            for attempt in range(2):
                try:
                    if self._tv_conn is None:
                        self._tv_conn = self.engine.raw_connection()
                        if self.engine.dialect.name == "postgresql":
                            self._tv_conn.driver_connection.autocommit = True
                    cur = self._tv_conn.cursor()
                    try:
                        cur.execute(self._tv_sql, (TOKENS_VERSION,))
                        row = cur.fetchone()
                    finally:
                        cur.close()
                    return row[0] if row else None
                except Exception:
                    conn, self._tv_conn = self._tv_conn, None
                    if conn is not None:
                        conn.invalidate()
                    if attempt:
                        raise

    def active_tokens(self) -> list[tuple[int, str, str, bool, str, float | None, str]]:
        """``(id, user, teams JSON, admin, hash, expires, scope)`` of the tokens not
        revoked (expired ones too: a request with one is told it expired)."""
        with self.engine.connect() as c:
            return [tuple(r) for r in c.execute(
                select(api_tokens.c.id, api_tokens.c.user, api_tokens.c.teams, api_tokens.c.admin, api_tokens.c.hash,
                       api_tokens.c.expires, api_tokens.c.scope)
                .where(api_tokens.c.revoked.is_(None)))]

    def active_tokens_cached(self) -> list[tuple[int, str, str, bool, str, float | None, str]]:
        """``active_tokens`` as of now, read again only when ``tokens_version`` changed
        since the last call: one primary-key read per call instead of the table's.
        A token created or revoked (by ``create_token`` / ``revoke_token``, any
        process) before the call is seen by it."""
        version = self.tokens_version()  # first: a change committed after it is seen by the next call
        cached = self._tokens_cache
        if cached is None or cached[0] != version:
            active = self.active_tokens()
            cached = self._tokens_cache = (version, active, bool(active) or version is not None or self._any_token())
        return cached[1]

    def had_tokens_cached(self) -> bool:
        """Whether this database has ever had a token, revoked ones included (as of the
        last ``active_tokens_cached``): once it has, the API stays authenticated even
        after the last token is revoked (note 008, "Auth")."""
        if self._tokens_cache is None:
            self.active_tokens_cached()
        return self._tokens_cache[2]

    def never_had_tokens_cached(self) -> bool:
        """Whether this database had no token at all at the last ``active_tokens_cached``
        (``False`` before the first: not known). No read: a token created since, by any
        process, is seen only by the next ``active_tokens_cached`` (note 032)."""
        cached = self._tokens_cache
        return cached is not None and not cached[2]

    def _any_token(self) -> bool:
        with self.engine.connect() as c:
            return c.execute(select(api_tokens.c.id).limit(1)).first() is not None

    def authenticate(self, token: str, active: list | None = None) -> Principal | None:
        """The principal of ``token``, or ``None`` (unknown or revoked); an expired one
        too (``Principal.expired``: the caller refuses it, saying when). Every active
        hash is compared in constant time."""
        found = None
        for token_id, user, teams, admin, stored, expires, scope in (self.active_tokens() if active is None
                                                                     else active):
            if digest_matches(token, stored):
                found = Principal(token_id, user, tuple(json.loads(teams)), bool(admin), scope=scope or "api",
                                  expires=expires)
        return found

    def update_jobs(self, values: dict[str, dict[str, Any]]) -> None:
        """Set columns of several jobs rows (job id -> column values) in one
        transaction, committed without an fsync of its own (SQLite
        ``synchronous=NORMAL``, PostgreSQL ``synchronous_commit`` off): it survives a
        crash of the server; after a power cut it may be lost, unless a later event-log
        commit (``append``, fully durable) followed it."""
        if not values:
            return
        with self._lazy.begin() as c:
            cur = c.connection.cursor()
            try:
                if c.dialect.name == "postgresql":
                    cur.execute("SET LOCAL synchronous_commit TO OFF")
                self._update_jobs_on(cur, values)
            finally:
                cur.close()

    def _update_jobs_on(self, cur, values: dict[str, dict[str, Any]]) -> None:
        """The ``UPDATE``s of ``update_jobs`` on the DBAPI cursor ``cur`` of an open
        transaction: one ``executemany`` per set of columns."""
        groups: dict[tuple[str, ...], list[dict]] = {}
        for job_id, vals in values.items():
            groups.setdefault(tuple(sorted(vals)), []).append({"_id": job_id, **vals})
        for cols, params in groups.items():
            self._executemany(cur, "jobs=", lambda cols=cols: update(jobs).where(
                jobs.c.id == bindparam("_id")).values({k: bindparam(k) for k in cols}), params)

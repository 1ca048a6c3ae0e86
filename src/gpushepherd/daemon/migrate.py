"""Schema migrations of the daemon's database (design note 008, "Schema migrations").

Alembic, run programmatically: the environment and the revisions are package data
(``gpushepherd/daemon/migrations``); users need no ``alembic.ini``. ``Store`` calls
``upgrade`` each time it opens a database.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import time
from pathlib import Path

# alembic says at INFO what it sets up (on import, on every open); an upgrade of a
# database in use is logged by ``upgrade`` instead
logging.getLogger("alembic").setLevel(logging.WARNING)

from alembic import command  # noqa: E402
from alembic.config import Config  # noqa: E402
from alembic.operations import Operations  # noqa: E402
from alembic.runtime.migration import MigrationContext  # noqa: E402
from alembic.script import ScriptDirectory  # noqa: E402
from sqlalchemy import inspect, text  # noqa: E402
from sqlalchemy.engine import Connection, Engine  # noqa: E402

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
log = logging.getLogger("gpushepherd.daemon")
#: the tables of revision 0001: a database holding any of them is ours
OUR_TABLES = ("events", "jobs", "server_lock", "meta", "arrays", "api_tokens")
#: PostgreSQL advisory lock key serialising migrations of one database ("shepherd")
PG_LOCK_KEY = 0x73686570


class SchemaError(RuntimeError):
    """The database's schema cannot be used or upgraded by this code; ``str()`` says why
    and what to do."""


def _config(conn: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if conn is not None:
        cfg.attributes["connection"] = conn
    return cfg


def script() -> ScriptDirectory:
    return ScriptDirectory.from_config(_config())


def head() -> str:
    """The newest revision this code knows."""
    return script().get_current_head()


def current(conn: Connection) -> str | None:
    """The database's revision: ``None`` when it has no ``alembic_version`` (empty, or
    made before Alembic); see ``state`` for which."""
    return MigrationContext.configure(conn).get_current_revision()


def state(conn: Connection) -> tuple[str, str | None]:
    """What the database is: ``("empty", None)``, ``("pre-alembic", None)`` (made by
    ``create_all`` with ``meta.schema_version = 1``), ``("foreign", why)``,
    ``("unknown", revision)`` (newer than this code), ``("behind", revision)`` or
    ``("head", revision)``."""
    rev = current(conn)
    if rev is not None:
        try:
            known = script().get_revision(rev) is not None
        except Exception:  # alembic raises CommandError/ResolutionError for an unknown id
            known = False
        if not known:
            return "unknown", rev
        return ("head" if rev == head() else "behind"), rev
    tables = set(inspect(conn).get_table_names()) & set(OUR_TABLES)
    if not tables:
        return "empty", None
    marker = None
    if "meta" in tables:
        marker = conn.execute(text("SELECT value FROM meta WHERE key = 'schema_version'")).scalar()
    if marker == "1":
        return "pre-alembic", None
    return "foreign", (f"it has tables {', '.join(sorted(tables))} but no alembic_version and meta.schema_version "
                       f"is {marker!r} (1 expected)")


def _holder_alive(conn: Connection, now: float, stale_s: float) -> dict | None:
    """The ``server_lock`` row of a server that still runs (fresh heartbeat, or its pid
    alive on this host), else ``None``."""
    if "server_lock" not in inspect(conn).get_table_names():
        return None
    row = conn.execute(text("SELECT host, pid, heartbeat FROM server_lock WHERE name = 'server'")).mappings().first()
    if row is None:
        return None
    if row["host"] == socket.gethostname():
        from gpushepherd.daemon.store import _pid_alive  # the rule acquire_lock applies

        # this process's own server (a second Store of it) does not count
        return dict(row) if _pid_alive(row["pid"]) and row["pid"] != os.getpid() else None
    return dict(row) if now - row["heartbeat"] <= stale_s else None


def _lock(conn: Connection) -> None:
    """Take the database's write lock for the rest of this transaction."""
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql("BEGIN IMMEDIATE")  # pysqlite opened none yet: DDL and DML in one transaction
    elif conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_LOCK_KEY})


def upgrade(engine: Engine, display_url: str, stale_s: float = 30.0) -> tuple[str | None, str]:
    """Bring the database to head, in one transaction holding its write lock. Returns
    ``(revision before, revision after)`` (before ``None``: empty or pre-Alembic).

    An empty database is created from nothing; one made before Alembic
    (``meta.schema_version = 1``) gets the tables it lacks and is stamped ``0001``, its
    data untouched.

    Raises:
        SchemaError: a revision this code does not know (a newer gpushepherd), tables
            that are not a gpushepherd schema, or an upgrade due while a live server
            holds the database.
    """
    with engine.connect() as conn:
        _lock(conn)
        what, detail = state(conn)
        if what == "head":
            conn.rollback()
            return detail, detail
        if what == "unknown":
            raise SchemaError(f"database {display_url} is at schema revision {detail!r}, which this gpushepherd does "
                              f"not know (it knows up to {head()!r}): a newer gpushepherd migrated it; run that "
                              "version, or another database")
        if what == "foreign":
            raise SchemaError(f"database {display_url} is not a gpushepherd database this code can use: {detail}")
        holder = _holder_alive(conn, time.time(), stale_s)
        if holder is not None and what != "empty":
            raise SchemaError(f"database {display_url} needs a schema upgrade ({detail or 'before Alembic'} -> "
                              f"{head()}) but a gpushepherd server holds it (pid {holder['pid']} on host "
                              f"{holder['host']}): stop that server first; a schema is never migrated under a "
                              "running server")
        if what == "pre-alembic":
            _create_missing_0001_tables(conn)
            command.stamp(_config(conn), "0001")
        command.upgrade(_config(conn), "head")
        conn.commit()
        if what != "empty":
            log.info("database %s: schema upgraded from %s to %s", display_url, detail or "before Alembic", head())
        return detail, head()


def _create_missing_0001_tables(conn: Connection) -> None:
    path = MIGRATIONS / "versions" / "0001_initial.py"
    spec = importlib.util.spec_from_file_location("gpushepherd_migration_0001", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    have = set(inspect(conn).get_table_names())
    with Operations.context(MigrationContext.configure(conn)):
        for name, create in module.TABLES.items():
            if name not in have:
                create()

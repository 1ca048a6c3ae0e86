"""Schema migrations of the daemon's database (Alembic, gpushepherd.daemon.migrate) on
SQLite and PostgreSQL (a throwaway server, tests/pgserver.py; skipped where none)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, insert, inspect, text

from gpushepherd.daemon import migrate
from gpushepherd.daemon.migrate import SchemaError
from gpushepherd.daemon.store import LockHeld, Store, api_tokens, events, meta, metadata, server_lock

POLICY = {"cluster": {"nodes": [{"name": "n", "gpus": 2}]}}
#: tables added by revisions after 0001
LATER_TABLES = ("services", "service_decisions", "snapshots", "ended_jobs", "idempotency_keys", "audit")


def pre_alembic(url: str, tables=None) -> None:
    """A database as the code before Alembic made it: its tables (those of revision 0001,
    as 0001 creates them: no column added since, such as ``api_tokens.expires``) and the
    ``schema_version`` row, with a logged policy and a token in it."""
    import importlib.util

    from alembic.operations import Operations

    spec = importlib.util.spec_from_file_location("m0001", migrate.MIGRATIONS / "versions" / "0001_initial.py")
    m0001 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m0001)
    engine = create_engine(url)
    # the tables of revision 0001 only (0002_services came after Alembic)
    tables = tables if tables is not None else [t for t in metadata.sorted_tables if t.name not in LATER_TABLES]
    with engine.begin() as c, Operations.context(MigrationContext.configure(c)):
        for name, create in m0001.TABLES.items():
            if name in {t.name for t in tables}:
                create()
    with engine.begin() as c:
        c.execute(insert(meta).values(key="schema_version", value="1"))
        c.execute(insert(events).values(batch=1, t=5.0, kind="policy", job_id=None, payload=json.dumps(POLICY)))
        if api_tokens in tables:
            c.execute(insert(api_tokens).values(user="ana", teams="[]", admin=True, hash="ab" * 32, created=1.0))
    engine.dispose()


def revision(url: str) -> str | None:
    engine = create_engine(url)
    with engine.connect() as c:
        rev = migrate.current(c)
    engine.dispose()
    return rev


def test_a_fresh_database_is_created_at_head_and_equals_the_metadata(db_url):
    store = Store(db_url)
    try:
        assert (store.revision_before, store.revision) == (None, migrate.head())
        with store.engine.connect() as c:
            assert compare_metadata(MigrationContext.configure(c), metadata) == []  # no column without a migration
        again = Store(db_url)  # at head: nothing to do
        assert (again.revision_before, again.revision) == (migrate.head(), migrate.head())
        again.close()
    finally:
        store.close()


def test_a_database_made_before_alembic_is_stamped_with_its_data_intact(db_url):
    pre_alembic(db_url)
    store = Store(db_url)
    try:
        assert (store.revision_before, store.revision) == (None, migrate.head())
        assert store.last_policy() == POLICY and [t["user"] for t in store.tokens()] == ["ana"]
        with store.engine.connect() as c:
            assert compare_metadata(MigrationContext.configure(c), metadata) == []
    finally:
        store.close()


def test_a_pre_alembic_database_without_the_later_tables_gets_them(db_url):
    old = [t for t in metadata.sorted_tables if t.name not in ("arrays", "api_tokens", *LATER_TABLES)]
    pre_alembic(db_url, tables=old)
    store = Store(db_url)
    try:
        assert {"arrays", "api_tokens"} <= set(inspect(store.engine).get_table_names())
        assert store.last_policy() == POLICY and store.revision == migrate.head()
        with store.engine.connect() as c:
            assert compare_metadata(MigrationContext.configure(c), metadata) == []
    finally:
        store.close()


def test_a_revision_this_code_does_not_know_is_refused(db_url):
    Store(db_url).close()
    engine = create_engine(db_url)
    with engine.begin() as c:
        c.execute(text("UPDATE alembic_version SET version_num = '0099_from_the_future'"))
    engine.dispose()
    with pytest.raises(SchemaError, match=r"schema revision '0099_from_the_future', which this gpushepherd does "
                                          rf"not know \(it knows up to '{migrate.head()}'\)"):
        Store(db_url)
    assert revision(db_url) == "0099_from_the_future"  # left as it was


def test_tables_that_are_not_ours_are_refused(db_url):
    engine = create_engine(db_url)
    metadata.create_all(engine, tables=[events])
    engine.dispose()
    with pytest.raises(SchemaError, match="not a gpushepherd database this code can use: it has tables events but no "
                                          "alembic_version and meta.schema_version is None"):
        Store(db_url)


def test_never_migrated_under_a_running_server(db_url):
    """A live server (here: a process of this host that is not us) holds a database
    that needs an upgrade: refused, nothing changed. At head it opens, and the lock
    refuses a second server as before."""
    pre_alembic(db_url)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import socket
        engine = create_engine(db_url)
        with engine.begin() as c:
            c.execute(insert(server_lock).values(name="server", token="t", host=socket.gethostname(),
                                                 pid=holder.pid, since=1.0, heartbeat=1.0))
        engine.dispose()
        with pytest.raises(SchemaError, match=rf"needs a schema upgrade \(before Alembic -> {migrate.head()}\) but a gpushepherd "
                                              rf"server holds it \(pid {holder.pid} on host"):
            Store(db_url)
        assert revision(db_url) is None
    finally:
        holder.kill()
        holder.wait()
    store = Store(db_url)  # the holder is dead: upgraded
    assert store.revision == migrate.head()
    store.acquire_lock(100.0)
    other = Store(db_url)  # at head: opens (the token commands work beside a server) ...
    with pytest.raises(LockHeld, match="another gpushepherd server holds it"):
        other.acquire_lock(101.0)  # ... but cannot become a second server
    other.close()
    store.close()


def test_processes_opening_a_fresh_database_at_once_migrate_it_once(db_url):
    opened, failed = [], []
    barrier = threading.Barrier(4)

    def open_it():
        barrier.wait()
        try:
            opened.append(Store(db_url))
        except Exception as exc:  # noqa: BLE001 - any failure fails the test below
            failed.append(exc)
    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failed and len(opened) == 4
    assert sorted(s.revision_before or "" for s in opened) == ["", migrate.head(), migrate.head(), migrate.head()]
    with opened[0].engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM alembic_version")).scalar() == 1
        assert c.execute(text("SELECT count(*) FROM meta")).scalar() == 1
    for s in opened:
        s.close()


def test_db_commands(tmp_path):
    from typer.testing import CliRunner

    from gpushepherd.cli.main import app

    def shepherd(*args):
        return CliRunner().invoke(app, list(args), catch_exceptions=False)

    data = tmp_path / "data"
    res = shepherd("db", "current", "--data-dir", str(data))
    assert res.exit_code == 2 and "no database there" in res.output
    data.mkdir()
    pre_alembic(Store.sqlite_url(data))
    res = shepherd("db", "current", "--data-dir", str(data))
    assert res.exit_code == 0 and "made before Alembic" in res.output and "stamps it 0001" in res.output
    assert revision(Store.sqlite_url(data)) is None  # `current` changed nothing
    res = shepherd("db", "upgrade", "--data-dir", str(data))
    assert res.exit_code == 0 and f"no revision -> {migrate.head()}" in res.output
    res = shepherd("db", "upgrade", "--data-dir", str(data))
    assert res.exit_code == 0 and f"already at revision {migrate.head()}" in res.output
    res = shepherd("db", "current", "--data-dir", str(data))
    assert res.exit_code == 0 and f"revision {migrate.head()} (head {migrate.head()}): up to date" in res.output
    engine = create_engine(Store.sqlite_url(data))
    with engine.begin() as c:
        c.execute(text("UPDATE alembic_version SET version_num = '0099_x'"))
    engine.dispose()
    for args in (("db", "current"), ("db", "upgrade"), ("token", "list")):
        res = shepherd(*args, "--data-dir", str(data))
        assert res.exit_code == 2 and "'0099_x'" in res.output, args
        assert "not know" in res.output or "is unknown to this gpushepherd" in res.output, args


def test_the_migrations_ship_in_the_package():
    from importlib import resources

    root = resources.files("gpushepherd") / "daemon" / "migrations"
    assert (root / "env.py").is_file() and (root / "script.py.mako").is_file()
    assert (root / "versions" / "0001_initial.py").is_file()


def upgraded_from(db_url: str, revision_: str, sql: str) -> Store:
    """A database brought to ``revision_``, ``sql`` run on it, then opened by ``Store`` (which
    upgrades it to head): the store, its schema checked equal to the metadata."""
    from alembic import command

    engine = create_engine(db_url)
    with engine.begin() as c:
        command.upgrade(migrate._config(c), revision_)
        c.execute(text(sql))
    engine.dispose()
    store = Store(db_url)
    assert (store.revision_before, store.revision) == (revision_, migrate.head())
    with store.engine.connect() as c:
        assert compare_metadata(MigrationContext.configure(c), metadata) == []
    return store


def test_a_database_at_0004_gets_token_expiry_and_scope_with_its_tokens_intact(db_url):
    store = upgraded_from(db_url, "0004_run_ids", "INSERT INTO api_tokens (\"user\", teams, admin, hash, created) "
                                                  "VALUES ('ana', '[\"ml\"]', false, 'ab', 1.0)")
    try:
        row = store.tokens()[0]
        assert (row["user"], row["teams"], row["expires"], row["scope"]) == ("ana", ["ml"], None, "api")
    finally:
        store.close()


def test_a_database_at_0003_gets_64_bit_run_ids_with_its_jobs_intact(db_url):
    store = upgraded_from(db_url, "0003_daemon_faults",
                          "INSERT INTO jobs (id, num, spec, argv, shell, env, cwd, state, run, pid) "
                          "VALUES ('1', 1, '{}', '[]', false, '{}', '/', 'RUNNING', 1, 41)")
    try:
        big = int("f" * 15, 16)
        uid = "0f3b2a9e-58c1-4d7e-9a41-3c2b1d0e9f87"
        store.update_jobs({"1": {"pid": big, "proc_start": uid}})
        assert (store.job_rows()["1"]["pid"], store.job_rows()["1"]["proc_start"]) == (big, uid)
    finally:
        store.close()

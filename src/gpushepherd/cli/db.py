"""``shepherd db current`` / ``shepherd db upgrade``: the schema revision of the
daemon's database (design note 008, "Schema migrations"). Both work on the database
directly (``--data-dir`` or ``--db``), like ``token``."""

from __future__ import annotations

from pathlib import Path

import typer

from gpushepherd.cli.daemon import DataDirOpt, DbOpt, _store, db_failure


def register(app: typer.Typer) -> None:
    """Add the ``db`` commands to ``app``."""
    from gpushepherd.cli.main import _console, err

    out = _console()
    db_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                         help="The server's database schema (Alembic revisions).")
    app.add_typer(db_app, name="db")

    @db_app.command("current")
    def current(data_dir: DataDirOpt = Path("shepherd-data"), db: DbOpt = None) -> None:
        """The database's schema revision and this code's head; changes nothing."""
        from sqlalchemy import create_engine
        from sqlalchemy.exc import SQLAlchemyError

        from gpushepherd.daemon import migrate
        from gpushepherd.daemon.store import Store

        url = db or Store.sqlite_url(data_dir)
        if db is None and not (data_dir / "shepherd.db").exists():
            err.print(f"error: --data-dir {data_dir}: no database there (shepherd.db); give --data-dir or --db",
                      soft_wrap=True)
            raise typer.Exit(2)
        try:
            engine = create_engine(url)
            shown = engine.url.render_as_string(hide_password=True)
            try:
                with engine.connect() as conn:
                    what, detail = migrate.state(conn)
            finally:
                engine.dispose()
        except SQLAlchemyError as exc:
            err.print(f"error: {db_failure(data_dir, db, exc)}", soft_wrap=True)
            raise typer.Exit(2) from None
        head = migrate.head()
        text = {
            "head": f"revision {detail} (head {head}): up to date",
            "behind": f"revision {detail} (head {head}): `shepherd db upgrade` (or a server start) upgrades it",
            "empty": f"no schema yet (head {head}): `shepherd db upgrade` (or a server start) creates it",
            "pre-alembic": f"made before Alembic (meta.schema_version 1; head {head}): `shepherd db upgrade` "
                           "(or a server start) stamps it 0001 and upgrades it",
        }.get(what)
        if text is None:
            why = (f"revision {detail!r} is unknown to this gpushepherd (head {head}): a newer one migrated it"
                   if what == "unknown" else f"not a gpushepherd database: {detail}")
            err.print(f"error: database {shown}: {why}", soft_wrap=True)
            raise typer.Exit(2)
        out.print(f"database {shown}: {text}", soft_wrap=True)

    @db_app.command("upgrade")
    def upgrade(data_dir: DataDirOpt = Path("shepherd-data"), db: DbOpt = None) -> None:
        """Upgrade the database to this code's schema (never under a running server)."""
        store = _store(data_dir, db, create=True)
        try:
            before, after = store.revision_before, store.revision
            if before == after:
                out.print(f"database {store.display_url}: already at revision {after}", soft_wrap=True)
            else:
                out.print(f"database {store.display_url}: {before or 'no revision'} -> {after}", soft_wrap=True)
        finally:
            store.close()

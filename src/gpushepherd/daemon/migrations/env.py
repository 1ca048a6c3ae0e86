"""Alembic environment of the daemon's database.

Run only programmatically (``gpushepherd.daemon.migrate``), on a connection the caller
opened and holds in a transaction: the caller commits.
"""

from alembic import context

from gpushepherd.daemon.store import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
context.run_migrations()

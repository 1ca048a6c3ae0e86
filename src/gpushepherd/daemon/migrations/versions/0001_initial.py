"""The schema as it was before Alembic (``metadata.create_all`` + ``meta.schema_version = 1``).

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _events():
    op.create_table(
        "events",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("batch", sa.Integer, nullable=False),
        sa.Column("t", sa.Float, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=True),
        sa.Column("payload", sa.Text, nullable=False),
    )
    op.create_index("ix_events_batch", "events", ["batch"])


def _jobs():
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("num", sa.Integer, nullable=False, unique=True),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("argv", sa.Text, nullable=False),
        sa.Column("shell", sa.Boolean, nullable=False),
        sa.Column("env", sa.Text, nullable=False),
        sa.Column("cwd", sa.String(4096), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("run", sa.Integer, nullable=False),
        sa.Column("pid", sa.Integer, nullable=True),
        sa.Column("pgid", sa.Integer, nullable=True),
        sa.Column("proc_start", sa.String(32), nullable=True),
        sa.Column("placement", sa.Text, nullable=True),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("kill_at", sa.Float, nullable=True),
        sa.Column("stdout", sa.String(4096), nullable=True),
        sa.Column("stderr", sa.String(4096), nullable=True),
    )


def _server_lock():
    op.create_table(
        "server_lock",
        sa.Column("name", sa.String(16), primary_key=True),
        sa.Column("token", sa.String(64), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("since", sa.Float, nullable=False),
        sa.Column("heartbeat", sa.Float, nullable=False),
    )


def _meta():
    op.create_table(
        "meta",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )


def _arrays():
    op.create_table(
        "arrays",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("num", sa.Integer, nullable=False, unique=True),
        sa.Column("array", sa.String(4096), nullable=False),
        sa.Column("indices", sa.Text, nullable=False),
        sa.Column("throttle", sa.Integer, nullable=False),
        sa.Column("max_retries", sa.Integer, nullable=False),
        sa.Column("submit_time", sa.Float, nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("argv", sa.Text, nullable=False),
        sa.Column("shell", sa.Boolean, nullable=False),
        sa.Column("env", sa.Text, nullable=False),
        sa.Column("cwd", sa.String(4096), nullable=False),
        sa.Column("cancelled", sa.Float, nullable=True),
    )


def _api_tokens():
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("teams", sa.Text, nullable=False),
        sa.Column("admin", sa.Boolean, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False, unique=True),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("revoked", sa.Float, nullable=True),
    )


#: each table's creation, by name: a database made before Alembic may lack the later
#: ones (``arrays``, ``api_tokens`` were added by ``create_all`` at a start); stamping
#: creates those first (gpushepherd.daemon.migrate)
TABLES = {"events": _events, "jobs": _jobs, "server_lock": _server_lock, "meta": _meta, "arrays": _arrays,
          "api_tokens": _api_tokens}


def upgrade() -> None:
    for create in TABLES.values():
        create()
    op.bulk_insert(sa.table("meta", sa.column("key", sa.String), sa.column("value", sa.Text)),
                   [{"key": "schema_version", "value": "1"}])


def downgrade() -> None:
    for name in reversed(TABLES):
        op.drop_table(name)

"""Engine run ids in ``jobs``: ``pid`` / ``pgid`` 64-bit integers, ``proc_start`` 64
characters.

A run in Ray or Kubernetes is recorded by a 60-bit number (the first 15 hex digits of
its actor id or pod uid, ``backends.ray`` / ``backends.kubernetes``), which PostgreSQL's
``INTEGER`` (32 bits) refuses with "integer out of range": the launch could not be
committed and the run was never started. ``proc_start`` holds a pod's uid (36
characters) where ``VARCHAR(32)`` fitted only a /proc start time and a Ray actor id.
SQLite's ``INTEGER`` already holds 64 bits (only its ``proc_start`` is altered, for the
schema to equal the metadata: it enforces no length).

Revision ID: 0004_run_ids
Revises: 0003_daemon_faults
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_run_ids"
down_revision = "0003_daemon_faults"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # SQLite cannot alter a column: the batch copies the table (its indexes kept)
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("proc_start", existing_type=sa.String(32), type_=sa.String(64), existing_nullable=True)
        if op.get_bind().dialect.name != "sqlite":
            for col in ("pid", "pgid"):
                batch.alter_column(col, existing_type=sa.Integer(), type_=sa.BigInteger(), existing_nullable=True)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("proc_start", existing_type=sa.String(64), type_=sa.String(32), existing_nullable=True)
        if op.get_bind().dialect.name != "sqlite":
            for col in ("pid", "pgid"):
                batch.alter_column(col, existing_type=sa.BigInteger(), type_=sa.Integer(), existing_nullable=True)

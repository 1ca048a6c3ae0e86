"""Engine run ids in ``jobs.pid`` / ``jobs.pgid``: 64-bit integers.

A run in Ray or Kubernetes is recorded by a 60-bit number (the first 15 hex digits of
its actor id or pod uid, ``backends.ray`` / ``backends.kubernetes``), which PostgreSQL's
``INTEGER`` (32 bits) refuses with "integer out of range": the launch could not be
committed and the run was never started. SQLite's ``INTEGER`` already holds 64 bits;
only other databases are altered.

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
    if op.get_bind().dialect.name == "sqlite":
        return
    for col in ("pid", "pgid"):
        op.alter_column("jobs", col, existing_type=sa.Integer(), type_=sa.BigInteger(), existing_nullable=True)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for col in ("pid", "pgid"):
        op.alter_column("jobs", col, existing_type=sa.BigInteger(), type_=sa.Integer(), existing_nullable=True)

"""The daemon under faults (note 017): tables ``snapshots``, ``ended_jobs`` and
``idempotency_keys``; an index on ``events.kind`` (the policy history is read by kind at
every start).

Revision ID: 0003_daemon_faults
Revises: 0002_services
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_daemon_faults"
down_revision = "0002_services"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "snapshots",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("batch", sa.Integer, nullable=False),
        sa.Column("t", sa.Float, nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
    )
    op.create_table(
        "ended_jobs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("record", sa.Text, nullable=False),
    )
    op.create_index("ix_ended_jobs_id_state", "ended_jobs", ["id", "state"])
    op.create_table(
        "idempotency_keys",
        sa.Column("scope", sa.String(300), primary_key=True),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("body_hash", sa.String(64), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("created", sa.Float, nullable=False),
    )
    op.create_index("ix_idempotency_keys_created", "idempotency_keys", ["created"])
    op.create_index("ix_events_kind", "events", ["kind"], if_not_exists=True)


def downgrade() -> None:
    op.drop_index("ix_events_kind", "events")
    op.drop_table("idempotency_keys")
    op.drop_table("ended_jobs")
    op.drop_table("snapshots")

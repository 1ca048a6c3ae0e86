"""Jobs on a pseudo-terminal (``shepherd run --pty``, note 041): ``jobs.pty``, true for a
job whose run gets a terminal the server relays; every existing job is false.

Revision ID: 0007_pty_jobs
Revises: 0006_tokens
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_pty_jobs"
down_revision = "0006_tokens"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("pty", sa.Boolean, nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("pty")

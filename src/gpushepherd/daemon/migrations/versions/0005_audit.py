"""The audit log (design note 023): table ``audit``, one row per submission, cancel, job
action, policy apply and token created, revoked, used or refused - who (the token's
user, the uid the kernel vouches for, the client's address), what and how it ended.

Revision ID: 0005_audit
Revises: 0004_run_ids
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_audit"
down_revision = "0004_run_ids"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("t", sa.Float, nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("token_id", sa.Integer, nullable=True),
        sa.Column("uid", sa.Integer, nullable=True),
        sa.Column("address", sa.String(255), nullable=True),
        sa.Column("team", sa.String(255), nullable=True),
        sa.Column("target", sa.String(255), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
    )
    op.create_index("ix_audit_t", "audit", ["t"])
    op.create_index("ix_audit_user", "audit", ["user"])


def downgrade() -> None:
    op.drop_index("ix_audit_user", "audit")
    op.drop_index("ix_audit_t", "audit")
    op.drop_table("audit")

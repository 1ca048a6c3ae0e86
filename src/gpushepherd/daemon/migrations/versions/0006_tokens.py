"""Tokens that expire and tokens for ``/metrics`` only (note 025): ``api_tokens.expires``
(epoch seconds, ``NULL``: never) and ``api_tokens.scope`` (``api`` or ``metrics``; every
existing token is ``api``).

Revision ID: 0006_tokens
Revises: 0005_audit
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_tokens"
down_revision = "0005_audit"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("expires", sa.Float, nullable=True))
        batch.add_column(sa.Column("scope", sa.String(16), nullable=False, server_default="api"))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("scope")
        batch.drop_column("expires")

"""Inference services (note 014): tables ``services`` and ``service_decisions``.

Revision ID: 0002_services
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_services"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "services",
        sa.Column("num", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("config", sa.Text, nullable=False),
        sa.Column("deleted", sa.Float, nullable=True),
    )
    op.create_index("ix_services_name", "services", ["name"])
    op.create_table(
        "service_decisions",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("service", sa.Integer, nullable=False),
        sa.Column("t", sa.Float, nullable=False),
        sa.Column("from_replicas", sa.Integer, nullable=False),
        sa.Column("to_replicas", sa.Integer, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
    )
    op.create_index("ix_service_decisions_service", "service_decisions", ["service"])


def downgrade() -> None:
    op.drop_table("service_decisions")
    op.drop_table("services")

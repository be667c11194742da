"""A job's own Python environment: jobs.environment, and where each task's stands on its agent

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import mwms.server.db.models

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

UTC = mwms.server.db.models.UTCDateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("environment", sa.JSON(), nullable=True))
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("environment", sa.String(length=10), server_default="", nullable=False))
        batch_op.add_column(sa.Column("environment_ready_at", UTC, nullable=True))
        batch_op.add_column(sa.Column("environment_build_s", sa.Float(), nullable=True))
        batch_op.add_column(
            sa.Column("environment_digest", sa.String(length=64), server_default="", nullable=False)
        )
        batch_op.add_column(
            sa.Column("environment_platform", sa.String(length=100), server_default="", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_column("environment_platform")
        batch_op.drop_column("environment_digest")
        batch_op.drop_column("environment_build_s")
        batch_op.drop_column("environment_ready_at")
        batch_op.drop_column("environment")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("environment")

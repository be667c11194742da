"""Attempt endings as data: each attempt event's cause (the ending's kind) and its details (what acted:
the preempting job and its priority, the team reclaiming, the agent drained or lost, the failed task)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempt_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cause", sa.String(length=30), server_default="", nullable=False))
        batch_op.add_column(sa.Column("details", sa.JSON(), server_default="{}", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("attempt_events", schema=None) as batch_op:
        batch_op.drop_column("details")
        batch_op.drop_column("cause")

"""Attempt events: every attempt state change (ACTIVE, then how it ended) is recorded with time and reason

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 23:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "attempt_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("attempt_id", sa.String(length=32), nullable=False),
        sa.Column("from_state", sa.String(length=20), nullable=True),
        sa.Column("to_state", sa.String(length=20), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempts.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("attempt_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_attempt_events_attempt_id"), ["attempt_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("attempt_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_attempt_events_attempt_id"))
    op.drop_table("attempt_events")

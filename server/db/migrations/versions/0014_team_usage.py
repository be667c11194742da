"""Fair share over time: team_usage (each team's decayed device-seconds per device kind) and usage_clock
(the moment usage is counted up to, and its half-life)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import mwms.server.db.models

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

UTC = mwms.server.db.models.UTCDateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "team_usage",
        sa.Column("team", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=10), nullable=False),
        sa.Column("device_seconds", sa.Float(), nullable=False),
        sa.Column("as_of", UTC, nullable=False),
        sa.PrimaryKeyConstraint("team", "kind"),
    )
    op.create_table(
        "usage_clock",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("accrued_to", UTC, nullable=False),
        sa.Column("half_life_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("usage_clock")
    op.drop_table("team_usage")

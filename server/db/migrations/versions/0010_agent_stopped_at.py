"""A cleanly stopped agent: agents.stopped_at, set when the agent says goodbye (AgentMessage.goodbye)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import mwms.server.db.models

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

UTC = mwms.server.db.models.UTCDateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("stopped_at", UTC, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.drop_column("stopped_at")

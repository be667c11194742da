"""Agents say how they confine their tasks (sandbox, task users): shown in the agent list

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 22:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("agents") as batch:
        batch.add_column(sa.Column("task_isolation", sa.String(200), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("agents") as batch:
        batch.drop_column("task_isolation")

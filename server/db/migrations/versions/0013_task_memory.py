"""Task resources: jobs.memory_per_worker and cpus_per_worker, agents.memory_bytes, and each task's
reported peak memory and applied memory limit

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("memory_bytes", sa.BigInteger(), server_default="0", nullable=False))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("memory_per_worker", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("cpus_per_worker", sa.Float(), nullable=True))
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("peak_memory_bytes", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("memory_limit_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_column("memory_limit_bytes")
        batch_op.drop_column("peak_memory_bytes")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("cpus_per_worker")
        batch_op.drop_column("memory_per_worker")
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.drop_column("memory_bytes")

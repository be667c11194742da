"""Warm pools: agents.warm_pool_size (registered), warm_pool_ready and warm_pool_bytes (from heartbeats)

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 08:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("warm_pool_size", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("warm_pool_ready", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("warm_pool_bytes", sa.BigInteger(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.drop_column("warm_pool_bytes")
        batch_op.drop_column("warm_pool_ready")
        batch_op.drop_column("warm_pool_size")

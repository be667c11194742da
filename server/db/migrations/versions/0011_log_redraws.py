"""Log lines that redraw a line (`\\r` progress bars): log_lines.replaces_seq and log_lines.superseded

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 20:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("log_lines", schema=None) as batch_op:
        batch_op.add_column(sa.Column("replaces_seq", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("superseded", sa.Boolean(), server_default=sa.false(), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("log_lines", schema=None) as batch_op:
        batch_op.drop_column("superseded")
        batch_op.drop_column("replaces_seq")

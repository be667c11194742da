"""NaN metric values (NULL), idempotency keys for job submits

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 12:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("metric_points") as batch:
        batch.alter_column("value", existing_type=sa.Float(), nullable=True)
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(length=100), nullable=True))
        batch.create_unique_constraint(
            "uq_jobs_submitter_idempotency_key", ["submitted_by", "idempotency_key"]
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint("uq_jobs_submitter_idempotency_key", type_="unique")
        batch.drop_column("idempotency_key")
    op.execute("DELETE FROM metric_points WHERE value IS NULL")
    with op.batch_alter_table("metric_points") as batch:
        batch.alter_column("value", existing_type=sa.Float(), nullable=False)

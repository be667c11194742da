"""A job's metric points in storage order: an index on (job_id, id), so a page that reads only the points
stored after a cursor (GET /jobs/{id}/metrics?after=) seeks to them instead of scanning the job's series

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 05:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_metric_points_job_id_id", "metric_points", ["job_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_metric_points_job_id_id", table_name="metric_points")

"""Indexes for jobs at volume: the jobs list pages by (created_at, id) with or without a state filter,
retention walks finished jobs by finished_at, live tasks are found by state, and a job's progress is read
from (job_id, attempt, step)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 13:20:00
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_jobs_state_created", table_name="jobs")
    op.create_index("ix_jobs_state_created_id", "jobs", ["state", "created_at", "id"])
    op.create_index("ix_jobs_created_id", "jobs", ["created_at", "id"])
    op.create_index("ix_jobs_finished_id", "jobs", ["finished_at", "id"])
    op.create_index("ix_tasks_state", "tasks", ["state"])
    op.create_index("ix_metric_points_job_attempt_step", "metric_points", ["job_id", "attempt", "step"])


def downgrade() -> None:
    op.drop_index("ix_metric_points_job_attempt_step", table_name="metric_points")
    op.drop_index("ix_tasks_state", table_name="tasks")
    op.drop_index("ix_jobs_finished_id", table_name="jobs")
    op.drop_index("ix_jobs_created_id", table_name="jobs")
    op.drop_index("ix_jobs_state_created_id", table_name="jobs")
    op.create_index("ix_jobs_state_created", "jobs", ["state", "created_at"])

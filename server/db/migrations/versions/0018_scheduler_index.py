"""Scheduler index: jobs (state, hold_until, priority), for the scheduler pass's count of waiting jobs and
its read of live holds (server/services/scheduler/waiting_jobs.py, job_rows.read_holds)

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06 11:10:00
"""

from __future__ import annotations

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_state_hold_priority", "jobs", ["state", "hold_until", "priority"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_jobs_state_hold_priority", table_name="jobs")

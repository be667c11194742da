"""Diagnostics: stack dumps of an attempt's tasks, preflight results per task, device samples per agent

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 15:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "stack_requests",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("cause", sa.String(20), nullable=False),
        sa.Column("requested_by", sa.String(200), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_stack_requests_job_requested", "stack_requests", ["job_id", "requested_at"])
    op.create_table(
        "stack_dumps",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "request_id",
            sa.String(32),
            sa.ForeignKey("stack_requests.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("task_id", sa.String(32), sa.ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
        sa.Column("task_index", sa.Integer, nullable=False),
        sa.Column("agent_id", sa.String(32), nullable=False),
        sa.Column("pid", sa.Integer, nullable=True),
        sa.Column("method", sa.String(20), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("in_collective", sa.Boolean, nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("request_id", "task_id"),
    )
    op.create_table(
        "preflight_results",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("task_id", sa.String(32), sa.ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("task_index", sa.Integer, nullable=False),
        sa.Column("ok", sa.Boolean, nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("report", sa.JSON, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("task_id"),
    )
    op.create_index("ix_preflight_results_job_attempt", "preflight_results", ["job_id", "attempt"])
    op.create_table(
        "device_samples",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("agent_id", sa.String(32), sa.ForeignKey("agents.id", ondelete="CASCADE"), nullable=False),
        sa.Column("device_index", sa.Integer, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("utilization_pct", sa.Float, nullable=False),
        sa.Column("memory_used_mib", sa.Integer, nullable=False),
        sa.Column("memory_total_mib", sa.Integer, nullable=False),
        sa.Column("temperature_c", sa.Float, nullable=False),
    )
    op.create_index("ix_device_samples_agent_at", "device_samples", ["agent_id", "at"])


def downgrade() -> None:
    op.drop_index("ix_device_samples_agent_at", table_name="device_samples")
    op.drop_table("device_samples")
    op.drop_index("ix_preflight_results_job_attempt", table_name="preflight_results")
    op.drop_table("preflight_results")
    op.drop_table("stack_dumps")
    op.drop_index("ix_stack_requests_job_requested", table_name="stack_requests")
    op.drop_table("stack_requests")

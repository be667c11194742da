"""Coordinator replicas: the replicas table, the agent's stream holder and epoch, a task's stored progress,
files shared through the database, device claims

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 03:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import mwms.server.db.models

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

UTC = mwms.server.db.models.UTCDateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("http_address", sa.String(length=300), nullable=False),
        sa.Column("grpc_address", sa.String(length=300), nullable=False),
        sa.Column("version", sa.String(length=50), nullable=False),
        sa.Column("serve", sa.String(length=10), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", UTC, nullable=False),
        sa.Column("seen_at", UTC, nullable=False),
        sa.Column("stopped_at", UTC, nullable=True),
        sa.Column("agents_held", sa.Integer(), nullable=False),
        sa.Column("loops", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_replicas_seen_at"), ["seen_at"], unique=False)
    op.create_table(
        "shared_files",
        sa.Column("path", sa.String(length=1200), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("chunks", sa.Integer(), nullable=False),
        sa.Column("created_at", UTC, nullable=False),
        sa.PrimaryKeyConstraint("path"),
    )
    op.create_table(
        "shared_file_chunks",
        sa.Column("path", sa.String(length=1200), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("path", "seq"),
    )
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("stream_replica", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("stream_epoch", sa.Integer(), server_default="0", nullable=False))
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("progress_at", UTC, nullable=True))
    op.create_table(
        "device_claims",
        sa.Column("agent_id", sa.String(length=32), nullable=False),
        sa.Column("device_index", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.String(length=32), nullable=False),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("agent_id", "device_index"),
    )
    with op.batch_alter_table("device_claims", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_device_claims_task_id"), ["task_id"], unique=False)
    _claim_devices_of_live_tasks()


def _claim_devices_of_live_tasks() -> None:
    """The tasks that hold devices now get their claims (the first holder of a device, should two)."""
    connection = op.get_bind()
    holding = ("ASSIGNED", "STARTING", "RUNNING", "LOST")
    tasks = sa.table(
        "tasks",
        sa.column("id", sa.String),
        sa.column("agent_id", sa.String),
        sa.column("device_indices", sa.JSON),
        sa.column("state", sa.String),
        sa.column("created_at", UTC),
    )
    claims = sa.table("device_claims", sa.column("agent_id"), sa.column("device_index"), sa.column("task_id"))
    seen: set[tuple[str, int]] = set()
    rows = []
    query = sa.select(tasks.c.id, tasks.c.agent_id, tasks.c.device_indices).where(tasks.c.state.in_(holding))
    for task_id, agent_id, indices in connection.execute(query.order_by(tasks.c.created_at)):
        for index in indices or []:
            key = (agent_id, int(index))
            if key not in seen:
                seen.add(key)
                rows.append({"agent_id": agent_id, "device_index": int(index), "task_id": task_id})
    if rows:
        connection.execute(claims.insert(), rows)


def downgrade() -> None:
    with op.batch_alter_table("device_claims", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_device_claims_task_id"))
    op.drop_table("device_claims")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_column("progress_at")
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.drop_column("stream_epoch")
        batch_op.drop_column("stream_replica")
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_replicas_seen_at"))
    op.drop_table("replicas")
    op.drop_table("shared_file_chunks")
    op.drop_table("shared_files")

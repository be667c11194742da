"""Sharing a cluster: job priority, team and preemptibility; teams and quotas; preemptions; cordons

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 00:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import mwms.server.db.models

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

UTC = mwms.server.db.models.UTCDateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "team_members",
        sa.Column("user", sa.String(length=200), nullable=False),
        sa.Column("team", sa.String(length=200), nullable=False),
        sa.Column("added_by", sa.String(length=200), nullable=False),
        sa.Column("added_at", UTC, nullable=False),
        sa.PrimaryKeyConstraint("user"),
    )
    with op.batch_alter_table("team_members", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_team_members_team"), ["team"], unique=False)
    op.create_table(
        "team_quotas",
        sa.Column("team", sa.String(length=200), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=True),
        sa.Column("cpu_slots", sa.Integer(), nullable=True),
        sa.Column("set_by", sa.String(length=200), nullable=False),
        sa.Column("set_at", UTC, nullable=False),
        sa.PrimaryKeyConstraint("team"),
    )
    op.create_table(
        "preemptions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("victim_job_id", sa.String(length=32), nullable=False),
        sa.Column("attempt_id", sa.String(length=32), nullable=False),
        sa.Column("preemptor_job_id", sa.String(length=32), nullable=True),
        sa.Column("cause", sa.String(length=20), nullable=False),
        sa.Column("at", UTC, nullable=False),
        sa.Column("ended_at", UTC, nullable=True),
        sa.Column("saved", sa.Boolean(), nullable=True),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempts.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["victim_job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("attempt_id"),
    )
    with op.batch_alter_table("preemptions", schema=None) as batch_op:
        batch_op.create_index("ix_preemptions_victim_at", ["victim_job_id", "at"], unique=False)
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cordoned_at", UTC, nullable=True))
        batch_op.add_column(
            sa.Column("cordoned_by", sa.String(length=200), server_default="", nullable=False)
        )
        batch_op.add_column(sa.Column("cordon_reason", sa.Text(), server_default="", nullable=False))
        batch_op.add_column(sa.Column("draining", sa.Boolean(), server_default=sa.false(), nullable=False))
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("borrowed", sa.Boolean(), server_default=sa.false(), nullable=False))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("priority", sa.Integer(), server_default="500", nullable=False))
        batch_op.add_column(sa.Column("team", sa.String(length=200), server_default="", nullable=False))
        batch_op.add_column(sa.Column("preemptible", sa.Boolean(), server_default=sa.true(), nullable=False))
        batch_op.add_column(sa.Column("hold", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("hold_until", UTC, nullable=True))
        batch_op.add_column(sa.Column("waiting", sa.JSON(), server_default="{}", nullable=False))
    # A job submitted before teams existed belongs to its submitter's own team.
    op.execute("UPDATE jobs SET team = submitted_by")
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.add_column(sa.Column("stop_grace_s", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks", schema=None) as batch_op:
        batch_op.drop_column("stop_grace_s")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        for column in ("waiting", "hold_until", "hold", "preemptible", "team", "priority"):
            batch_op.drop_column(column)
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("borrowed")
    with op.batch_alter_table("agents", schema=None) as batch_op:
        for column in ("draining", "cordon_reason", "cordoned_by", "cordoned_at"):
            batch_op.drop_column(column)
    with op.batch_alter_table("preemptions", schema=None) as batch_op:
        batch_op.drop_index("ix_preemptions_victim_at")
    op.drop_table("preemptions")
    op.drop_table("team_quotas")
    with op.batch_alter_table("team_members", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_team_members_team"))
    op.drop_table("team_members")

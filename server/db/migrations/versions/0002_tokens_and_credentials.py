"""tokens, agent credentials, who submitted and cancelled a job

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 12:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tokens",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=10), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("user", sa.String(length=200), nullable=False),
        sa.Column("role", sa.String(length=10), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("parent_id", sa.String(length=32), nullable=True),
        sa.Column("created_by", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["parent_id"], ["tokens.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )
    op.create_index(op.f("ix_tokens_parent_id"), "tokens", ["parent_id"], unique=False)
    with op.batch_alter_table("agents") as batch:
        batch.add_column(sa.Column("credential_hash", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("removed_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("submitted_by", sa.String(length=200), nullable=False, server_default=""))
        batch.add_column(sa.Column("cancelled_by", sa.String(length=200), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("cancelled_by")
        batch.drop_column("submitted_by")
    with op.batch_alter_table("agents") as batch:
        batch.drop_column("removed_at")
        batch.drop_column("credential_hash")
    op.drop_index(op.f("ix_tokens_parent_id"), table_name="tokens")
    op.drop_table("tokens")

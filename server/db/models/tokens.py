"""SQLAlchemy models (server/db/models/): bearer secrets: API tokens, dashboard sessions and agent join tokens."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    ForeignKey,
    String,
)
from sqlalchemy.orm import Mapped, mapped_column

from mwms.server.db.models import Base, new_id, utcnow


class Token(Base):
    """A bearer secret, stored only as its sha256: an API token, a dashboard session or an agent join token.

    API tokens belong to a user and carry a role. A dashboard session is derived from the API token that
    logged in (parent_id) and dies with it. Join tokens admit new agents.
    """

    __tablename__ = "tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    kind: Mapped[str] = mapped_column(String(10))  # "api", "session" or "join"
    name: Mapped[str] = mapped_column(String(200), default="")
    user: Mapped[str] = mapped_column(String(200), default="")
    role: Mapped[str] = mapped_column(String(10), default="")  # "admin", "user", "viewer"; "" for join
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    parent_id: Mapped[str | None] = mapped_column(
        ForeignKey("tokens.id", ondelete="CASCADE"), default=None, index=True
    )
    created_by: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(default=None)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)

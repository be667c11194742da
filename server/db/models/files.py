"""SQLAlchemy models (server/db/models/): stored bytes: job bundles, task files, and shared files with their chunks."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from mwms.server.db.models import Base, utcnow


class Bundle(Base):
    __tablename__ = "bundles"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(Integer)
    archive_format: Mapped[str] = mapped_column(String(10))  # "tar.gz" or "zip"
    filename: Mapped[str] = mapped_column(String(255), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class StoredFile(Base):
    """A file the coordinator keeps for a job: an artifact from the chief, or a checkpoint archive."""

    __tablename__ = "stored_files"
    __table_args__ = (UniqueConstraint("job_id", "kind", "attempt", "path"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(20))  # "artifact" or "checkpoint"
    attempt: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(String(1000))
    size: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class SharedFile(Base):
    """A file of the data dir (a bundle, a checkpoint, an artifact) kept in the database too, so that every
    replica can serve it (server/services/storage/shared_files.py); on SQLite the data dir alone holds it."""

    __tablename__ = "shared_files"

    # Relative to the data dir, e.g. "bundles/<digest>", "files/<job>/checkpoint.tar.gz".
    path: Mapped[str] = mapped_column(String(1200), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    chunks: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class SharedFileChunk(Base):
    """One piece (at most 1 MiB) of a shared file's content, in order."""

    __tablename__ = "shared_file_chunks"

    path: Mapped[str] = mapped_column(String(1200), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)

"""Uploaded bundles and the artifacts jobs store."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class BundleOut(BaseModel):
    digest: str
    size: int
    format: str
    created: bool = Field(description="false when this content was already stored")


class ArtifactOut(BaseModel):
    path: str
    size: int
    sha256: str
    attempt: int
    created_at: datetime

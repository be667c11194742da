"""The coordinator processes on the database."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class ReplicaOut(BaseModel):
    """One coordinator process on the database (GET /api/v1/replicas)."""

    id: str = Field(description="new at every start of the process")
    name: str
    http_address: str = Field(
        description="HOST:PORT of its HTTP server (for an agents-only one: /healthz and /metrics)"
    )
    grpc_address: str = Field(description="HOST:PORT of its gRPC for agents; empty for an API-only replica")
    version: str
    serve: str = Field(description="api, agents or both")
    pid: int
    started_at: datetime
    seen_at: datetime = Field(description="its last beat (about every second)")
    stopped_at: datetime | None = Field(description="set by a clean stop")
    alive: bool = Field(description="seen within the last 10 s and not stopped")
    agents_held: int = Field(description="agent streams it holds")
    loops: list[str] = Field(description="background loops it leads (holds the lock of)")

"""/healthz and Prometheus /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from server.api.deps import ReadSession

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(session: ReadSession) -> dict[str, str]:
    """ok when the coordinator can reach its database."""
    session.execute(text("SELECT 1"))
    return {"status": "ok"}


@router.get("/metrics", include_in_schema=False)
def prometheus_metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

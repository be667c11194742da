"""/healthz and Prometheus /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

from server.api.deps import ReadSession
from server.observability.cluster_gauges import render

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(session: ReadSession) -> dict[str, str]:
    """ok when the coordinator can reach its database."""
    session.execute(text("SELECT 1"))
    return {"status": "ok"}


@router.get("/metrics", include_in_schema=False)
def prometheus_metrics(request: Request) -> Response:
    """Prometheus text format; any valid token (the viewer role) may scrape."""
    return Response(
        render(getattr(request.app.state, "cluster_metrics", None)), media_type=CONTENT_TYPE_LATEST
    )

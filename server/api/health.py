"""/healthz and Prometheus /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

from mwms.server.api.deps import ReadSession
from mwms.server.observability.cluster_gauges import render

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(session: ReadSession, request: Request) -> dict[str, str]:
    """ok when the coordinator can reach its database; where this process serves the agents' gRPC,
    "grpc" says what its grpc.health.v1 answers (SERVING, or NOT_SERVING while it starts or stops) and
    "grpc_port" the port it serves it on (not secret: every agent is told it)."""
    session.execute(text("SELECT 1"))
    answer = {"status": "ok"}
    grpc_health = getattr(request.app.state, "grpc_health", None)  # None: an `--serve api` replica
    if grpc_health is not None:
        answer["grpc"] = grpc_health.status
        # The port agents dial here: an agent given this HTTP port as --server names it (issue 31).
        answer["grpc_port"] = str(getattr(request.app.state, "grpc_port", 0))
    return answer


@router.get("/metrics", include_in_schema=False)
def prometheus_metrics(request: Request) -> Response:
    """Prometheus text format; any valid token (the viewer role) may scrape."""
    return Response(
        render(getattr(request.app.state, "cluster_metrics", None)), media_type=CONTENT_TYPE_LATEST
    )

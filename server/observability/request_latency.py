"""API request latency by route template: an ASGI middleware in front of every other one.

The route label is the template the router matched (`/api/v1/jobs/{job_id}`), never the raw path, so
the number of series stays bounded whatever clients send. A request that reached no route is labelled
"unmatched": refused before routing (no or a wrong token, a foreign Host) or a path that does not exist. The time is taken until the response starts (its status and
headers), so a log follow or a download that streams for minutes does not read as a slow request.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mwms.server.observability.instruments import API_REQUEST_LATENCY

UNMATCHED = "unmatched"
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def route_template(scope: Scope) -> str:
    """The path template of the route that handled the request, or UNMATCHED."""
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) and path else UNMATCHED


class RequestLatencyMiddleware:
    """Observes mwms_api_request_duration_seconds for every HTTP request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0

        async def timed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                _observe(scope, status, time.perf_counter() - started)
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            if status == 0:  # no response started: the client went away, or an error escaped
                _observe(scope, 500, time.perf_counter() - started)


def _observe(scope: Scope, status: int, seconds: float) -> None:
    method = scope.get("method", "")
    API_REQUEST_LATENCY.labels(
        route=route_template(scope),
        method=method if method in KNOWN_METHODS else "other",
        status=f"{status // 100}xx",
    ).observe(seconds)

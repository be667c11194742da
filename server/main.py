"""`mwms server`: runs the coordinator (REST + dashboard over HTTP, agents over gRPC) until stopped."""

from __future__ import annotations

import logging

import uvicorn

from server.app import create_app
from server.settings import Settings


def serve(settings: Settings) -> None:
    """Blocks serving the coordinator; SIGINT/SIGTERM stop it cleanly."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    config = uvicorn.Config(
        app, host=settings.http_host, port=settings.http_port, log_level="info", access_log=False, lifespan="on"
    )
    server = uvicorn.Server(config)
    server.run()
    if not server.started:
        raise SystemExit(1)

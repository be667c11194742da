"""The coordinator's FastAPI factory; its lifespan runs migrations, the gRPC server and background loops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from starlette.middleware.trustedhost import TrustedHostMiddleware

import mwms
from mwms.v1 import agent_pb2_grpc
from server.admin_token import bootstrap_admin_token
from server.api import agents, bundles, dashboard, devices, health, jobs, session, tokens
from server.api.auth import AuthMiddleware
from server.api.body_limit import BodyLimitMiddleware
from server.api.deps import Runtime
from server.api.errors import install_error_handlers
from server.api.preflight import router as preflight_router
from server.api.security_headers import SecurityHeadersMiddleware
from server.api.stacks import router as stacks_router
from server.db.engine import Database
from server.db.migrate import upgrade_to_head
from server.hang_detector import HangDetector
from server.limits import (
    GRPC_ABSOLUTE_MAX_METADATA_BYTES,
    GRPC_HANDSHAKE_TIMEOUT_MS,
    GRPC_MAX_CONNECTION_IDLE_MS,
    GRPC_MAX_METADATA_BYTES,
)
from server.liveness import Liveness
from server.loops import BackgroundLoops
from server.observability.cluster_gauges import cluster_registry
from server.observability.request_latency import RequestLatencyMiddleware
from server.rpc.agent_service import AgentService
from server.rpc.auth import AgentAuthInterceptor
from server.rpc.device_ingest import DeviceTelemetryWriter
from server.rpc.hub import AgentHub
from server.rpc.ingest import TelemetryWriter
from server.rpc.stack_collector import StackCollector
from server.services.agents import grant_reconnect_grace
from server.services.follows import FollowSlots
from server.settings import Settings
from server.task_progress import TaskProgress
from server.tls import bind_grpc_port

log = logging.getLogger("mwms.server")
GRPC_MAX_MESSAGE = 16 * 1024 * 1024
SWAGGER_UI = "swagger-ui-5.35.0"  # web/vendor/<this>: the released swagger-ui-dist files and their licence
SWAGGER_PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>mwms coordinator API</title>
<link rel="stylesheet" href="/static/vendor/{SWAGGER_UI}/swagger-ui.css">
<link rel="icon" href="/static/vendor/{SWAGGER_UI}/favicon-32x32.png"></head>
<body><div id="swagger-ui"></div>
<script src="/static/vendor/{SWAGGER_UI}/swagger-ui-bundle.js"></script>
<script src="/static/js/swagger-init.js"></script></body></html>
"""


def _grant_reconnect_grace(db: Database, settings: Settings) -> None:
    with db.write() as session:
        grant_reconnect_grace(session, settings.agent_timeout_s + settings.reconnect_grace_s)


def create_app(settings: Settings) -> FastAPI:
    """A coordinator app for `settings`; starting it (lifespan) also serves gRPC on settings.grpc_port."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        db = Database(settings.database_url)
        await asyncio.to_thread(upgrade_to_head, db.engine)
        await asyncio.to_thread(_grant_reconnect_grace, db, settings)
        await asyncio.to_thread(bootstrap_admin_token, db, settings)
        hub = AgentHub(asyncio.get_running_loop(), db)
        liveness = Liveness()
        loops = BackgroundLoops(db, settings, hub, liveness)
        progress = TaskProgress()  # hang detection's clock, fed by the telemetry writer
        telemetry = TelemetryWriter(db, hub.wake, loops.poke, progress=progress)
        stacks = StackCollector(db, hub)
        hangs = HangDetector(db, settings, stacks, progress, hub.wake, loops.poke)
        devices = DeviceTelemetryWriter(db, settings)
        grpc_server = grpc.aio.server(
            interceptors=[AgentAuthInterceptor(db)],
            options=[
                ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE),
                ("grpc.max_send_message_length", GRPC_MAX_MESSAGE),
                ("grpc.keepalive_time_ms", 10_000),
                ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
                ("grpc.keepalive_permit_without_calls", 1),
                # Bounds for callers that never authenticate (issue 16): a call's metadata, a connection
                # with no call open (agents keep their Connect stream open), and a slow handshake.
                ("grpc.max_metadata_size", GRPC_MAX_METADATA_BYTES),
                ("grpc.absolute_max_metadata_size", GRPC_ABSOLUTE_MAX_METADATA_BYTES),
                ("grpc.max_connection_idle_ms", GRPC_MAX_CONNECTION_IDLE_MS),
                ("grpc.server_handshake_timeout_ms", GRPC_HANDSHAKE_TIMEOUT_MS),
            ],
        )
        agent_pb2_grpc.add_AgentServiceServicer_to_server(
            AgentService(db, settings, hub, loops.poke, liveness, telemetry, devices, stacks=stacks),
            grpc_server,
        )
        bound = bind_grpc_port(grpc_server, settings)  # TLS when a certificate is configured
        if bound == 0:
            raise RuntimeError(
                f"cannot listen for agents on {settings.grpc_host}:{settings.grpc_port}: the port is in use; "
                "pass another --grpc-port"
            )
        app.state.grpc_port = bound
        app.state.hub, app.state.liveness, app.state.telemetry = hub, liveness, telemetry  # tests, benchmarks
        app.state.device_telemetry = devices  # the newest device samples, for server/api/devices.py
        app.state.stacks = stacks  # server/api/stacks.py sends and waits through it
        await grpc_server.start()
        app.state.runtime = Runtime(db=db, settings=settings, poke_scheduler=loops.poke, wake_agents=hub.wake)
        app.state.cluster_metrics = cluster_registry(db, hub.connected_count)  # read by /metrics
        hub.start()
        telemetry.start()
        devices.start()
        loops.start()
        hangs.start()
        log.info("coordinator ready: gRPC for agents on %s:%d", settings.grpc_host, bound)
        try:
            yield
        finally:
            await grpc_server.stop(grace=2)
            await hangs.stop()
            await telemetry.stop()
            await devices.stop()
            await hub.stop()
            await loops.stop()
            db.dispose()

    app = FastAPI(
        title="mwms coordinator",
        version=mwms.__version__,
        description="Jobs, agents, bundles, logs and metrics for MultiWorkerMirroredStrategy training.",
        lifespan=lifespan,
        docs_url=None,  # served below from the vendored Swagger UI: training clusters are often offline
        redoc_url=None,
    )

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        # FastAPI's own page starts Swagger UI with an inline script, which the CSP forbids.
        return HTMLResponse(SWAGGER_PAGE)

    install_error_handlers(app)
    app.include_router(stacks_router)
    app.include_router(preflight_router)
    app.state.follow_slots = FollowSlots(settings.max_follows_per_user, settings.max_follows_total)
    routers = (health.router, session.router, tokens.router, bundles.router, jobs.router, agents.router)
    for router in (*routers, devices.router, dashboard.router):
        app.include_router(router)
    # The last added runs first: request timing, headers on every response, then the Host check, then
    # authentication, then the bound on request bodies.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_body_bytes)
    app.add_middleware(AuthMiddleware)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=settings.trusted_hosts)
    app.add_middleware(SecurityHeadersMiddleware, tls=settings.serves_tls)
    app.add_middleware(RequestLatencyMiddleware)  # outermost: times every request, refused ones too
    return app

"""The coordinator's FastAPI factory; its lifespan runs migrations, the gRPC server and background loops."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

import grpc
from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from starlette.middleware.trustedhost import TrustedHostMiddleware

import mwms
from mwms.agent_link import server_keepalive_options
from mwms.private_files import secure_data_dir
from mwms.server.admin_token import bootstrap_admin_token
from mwms.server.api import agents, bundles, dashboard, devices, health, jobs, login, tokens
from mwms.server.api.auth import DOCS_PATH, AuthMiddleware
from mwms.server.api.body_limit import BodyLimitMiddleware
from mwms.server.api.errors import install_error_handlers
from mwms.server.api.openapi_document import install_openapi, operation_id
from mwms.server.api.preflight import router as preflight_router
from mwms.server.api.replicas import router as replicas_router
from mwms.server.api.security_headers import SecurityHeadersMiddleware
from mwms.server.api.sharing import router as sharing_router
from mwms.server.api.stacks import router as stacks_router
from mwms.server.api.view_cache import InvalidateOnWrites, ViewCache
from mwms.server.db.engine import Database
from mwms.server.db.migrate import upgrade_to_head
from mwms.server.db.models import new_id
from mwms.server.db.single_instance import SingleInstanceLock
from mwms.server.limits import (
    BLOCKING_THREADS,
    GRPC_ABSOLUTE_MAX_METADATA_BYTES,
    GRPC_HANDSHAKE_TIMEOUT_MS,
    GRPC_MAX_CONNECTION_IDLE_MS,
    GRPC_MAX_METADATA_BYTES,
)
from mwms.server.listen_ports import CannotListen, port_in_use_message
from mwms.server.live.wiring import Wiring, build_wiring
from mwms.server.observability.cluster_gauges import cluster_registry
from mwms.server.observability.request_latency import RequestLatencyMiddleware
from mwms.server.rpc import convert
from mwms.server.rpc.agent_service import AgentService
from mwms.server.rpc.auth import AgentAuthInterceptor
from mwms.server.rpc.health import GrpcHealth
from mwms.server.services.fleet import replicas
from mwms.server.services.fleet.agents import grant_reconnect_grace
from mwms.server.services.observing.follows import FollowSlots
from mwms.server.settings import Settings
from mwms.server.tls import bind_grpc_port
from mwms.v1 import agent_pb2_grpc

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


def _grant_reconnect_grace(db: Database, settings: Settings, me: replicas.ReplicaIdentity) -> None:
    """After the whole control plane was down, agents get time to reconnect before they count as lost;
    a replica joining live ones gives none (they kept hearing the agents)."""
    with db.write() as session:
        if replicas.others_alive(session, me.id) == 0:
            grant_reconnect_grace(session, settings.reconnect_window_s)
        replicas.beat(session, me, 0, [])


def replica_identity(settings: Settings) -> replicas.ReplicaIdentity:
    """This process as one of the replicas on its database; the addresses are filled in once bound."""
    host = socket.gethostname()
    return replicas.ReplicaIdentity(
        id=new_id(),
        name=settings.replica_name or f"{host}:{os.getpid()}",
        http_address="",
        grpc_address="",
        version=mwms.__version__,
        serve=settings.serve,
        pid=os.getpid(),
    )


@asynccontextmanager
async def serving(app: FastAPI, settings: Settings) -> AsyncIterator[None]:
    """The coordinator's life inside the app's lifespan: migrations, this replica's first beat, the
    admin token, gRPC for agents (unless it serves the API only), then the live machinery."""
    # Blocking work runs in threads that mostly wait (for the writer lock, a row, the database): Python's
    # default of cores + 4 let a handful of waiting writers hold up every credential check and read.
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=BLOCKING_THREADS, thread_name_prefix="mwms")
    )
    db = Database(settings.database_url)
    me = replica_identity(settings)
    await asyncio.to_thread(upgrade_to_head, db.engine)
    await asyncio.to_thread(_grant_reconnect_grace, db, settings, me)
    await asyncio.to_thread(bootstrap_admin_token, db, settings)
    wiring = build_wiring(db, settings, me, decode=convert.telemetry_items)
    app.state.wiring = wiring  # routers get it through server/api/deps.py
    app.state.cluster_metrics = cluster_registry(db, wiring.hub.connected_count, wiring.passes.leads)
    app.state.grpc_port = 0
    grpc_health = GrpcHealth() if settings.serve != "api" else None
    app.state.grpc_health = grpc_health  # /healthz reports it (server/api/health.py)
    grpc_server = None if grpc_health is None else await start_grpc(app, settings, wiring, grpc_health)
    wiring.start()
    if grpc_health is not None:
        await grpc_health.serving()
    try:
        yield
    finally:
        if grpc_server is not None and grpc_health is not None:
            await grpc_health.stopping()  # before the grace period: probes and Watch streams see it
            await grpc_server.stop(grace=2)
        await wiring.stop()
        db.dispose()


async def start_grpc(
    app: FastAPI, settings: Settings, wiring: Wiring, grpc_health: GrpcHealth
) -> grpc.aio.Server:
    """Serves the agents' gRPC on settings.grpc_port (TLS when a certificate is configured), with
    grpc.health.v1 and, unless settings.grpc_reflection is off, server reflection."""
    db = wiring.db
    grpc_server = grpc.aio.server(
        interceptors=[AgentAuthInterceptor(db)],
        options=[
            ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE),
            ("grpc.max_send_message_length", GRPC_MAX_MESSAGE),
            *server_keepalive_options(),  # the agents' pings pass this policy (mwms/agent_link.py)
            # Bounds for callers that never authenticate (issue 16): a call's metadata, a connection
            # with no call open (agents keep their Connect stream open), and a slow handshake.
            ("grpc.max_metadata_size", GRPC_MAX_METADATA_BYTES),
            ("grpc.absolute_max_metadata_size", GRPC_ABSOLUTE_MAX_METADATA_BYTES),
            ("grpc.max_connection_idle_ms", GRPC_MAX_CONNECTION_IDLE_MS),
            ("grpc.server_handshake_timeout_ms", GRPC_HANDSHAKE_TIMEOUT_MS),
            # gRPC's default SO_REUSEPORT let a second coordinator share the port, agents reaching
            # either at random (issue 31): a taken port is refused (server/listen_ports.py).
            ("grpc.so_reuseport", 0),
        ],
    )
    agent_pb2_grpc.add_AgentServiceServicer_to_server(
        AgentService(wiring),
        grpc_server,
    )
    await grpc_health.add_to(grpc_server, reflection_on=settings.grpc_reflection)
    taken = port_in_use_message("agents (gRPC)", settings.grpc_host, settings.grpc_port, "--grpc-port")
    try:
        bound = bind_grpc_port(grpc_server, settings)  # TLS when a certificate is configured
    except RuntimeError:  # newer grpc raises where older returned 0
        raise CannotListen(taken) from None
    if bound == 0:
        raise CannotListen(taken)
    app.state.grpc_port = bound
    await grpc_server.start()
    # Not "ready": REST may not listen yet (server/main.py logs ready once both do).
    log.info("gRPC for agents listens on %s:%d", settings.grpc_host, bound)
    return grpc_server


def create_app(settings: Settings, *, single_instance: bool = True) -> FastAPI:
    """A coordinator app for `settings`; starting it (lifespan) also serves gRPC on settings.grpc_port.

    `single_instance`: the lifespan takes the SQLite single-coordinator lock (False: the caller holds it,
    as server/main.py does to refuse a second coordinator before anything starts)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        secure_data_dir(settings.data_dir, settings.database_url)  # 0700, secrets 0600 (private_files.py)
        single = SingleInstanceLock(settings.database_url if single_instance else "")
        single.acquire()  # SQLite: a second coordinator on the same file stops here (AlreadyRunning)
        try:
            async with serving(app, settings):
                yield
        finally:
            single.release()

    app = FastAPI(
        title="mwms coordinator",
        version=mwms.__version__,
        description="Jobs, agents, bundles, logs and metrics for MultiWorkerMirroredStrategy training.",
        lifespan=lifespan,
        docs_url=None,  # served below from the vendored Swagger UI: training clusters are often offline
        redoc_url=None,
        generate_unique_id_function=operation_id,  # `list_jobs`, not `list_jobs_api_v1_jobs_get`
    )

    @app.get(DOCS_PATH, include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        # FastAPI's own page starts Swagger UI with an inline script, which the CSP forbids.
        return HTMLResponse(SWAGGER_PAGE)

    install_error_handlers(app)
    install_openapi(app, settings)  # the bearer scheme, 401/403 on protected operations, our 422 shape
    app.state.follow_slots = FollowSlots(settings.max_follows_per_user, settings.max_follows_total)
    app.state.view_cache = view_cache = ViewCache(settings.view_cache_seconds)
    app.include_router(health.router)  # every role: load balancers and Prometheus look at each replica
    if settings.serve != "agents":  # an agents-only replica serves gRPC, /healthz and /metrics only
        app.include_router(stacks_router)
        app.include_router(preflight_router)
        app.include_router(sharing_router)
        app.include_router(replicas_router)
        routers = (login.router, tokens.router, bundles.router, jobs.router, agents.router)
        for router in (*routers, devices.router, dashboard.router):
            app.include_router(router)
    # The last added runs first: request timing, headers on every response, then the Host check, then
    # authentication, then the bound on request bodies, then the polled lists' cache going stale on writes.
    app.add_middleware(InvalidateOnWrites, cache=view_cache)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_body_bytes)
    app.add_middleware(AuthMiddleware)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=settings.trusted_hosts)
    app.add_middleware(SecurityHeadersMiddleware, tls=settings.serves_tls)
    app.add_middleware(RequestLatencyMiddleware)  # outermost: times every request, refused ones too
    return app

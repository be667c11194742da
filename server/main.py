"""`mwms server`: runs the coordinator (REST + dashboard over HTTP(S), agents over gRPC) until stopped."""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import tempfile
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from server.app import create_app
from server.db.single_instance import AlreadyRunning, SingleInstanceLock
from server.heap import settle_heap
from server.http_protocol import bounded_http_protocol
from server.limits import HttpBounds
from server.settings import Settings
from server.tls import TlsError, TlsPlan, plan_tls, warn_if_clear_text

log = logging.getLogger("mwms.server")
# Seconds a stop waits for open requests (log follows) before closing them.
SHUTDOWN_GRACE_S = 3


def serve(settings: Settings) -> None:
    """Blocks serving the coordinator; SIGINT/SIGTERM stop it cleanly."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        tls = plan_tls(settings)
    except TlsError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    log_tls(settings, tls)
    if settings.ports_file is not None:
        settings.ports_file.unlink(missing_ok=True)  # whoever waits for it must never read an old one
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    single = SingleInstanceLock(settings.database_url)
    try:
        single.acquire()
    except AlreadyRunning as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    app = create_app(settings, single_instance=False)
    config = uvicorn.Config(
        app,
        host=settings.http_host,
        port=settings.http_port,
        log_level="info",
        access_log=False,
        lifespan="on",
        # httptools, held to a bound on request heads and to timeouts for slow clients (issue 16).
        http=bounded_http_protocol(HttpBounds.of(settings)),
        timeout_keep_alive=settings.http_keep_alive_s,
        ssl_certfile=str(tls.http.cert) if tls.http else None,
        ssl_keyfile=str(tls.http.key) if tls.http else None,
        # Open log follows would otherwise hold a stop until their jobs end; clients follow again.
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    server = PortsReportingServer(config, app, settings)
    settle_heap()  # only in the coordinator's own process: tests build many apps in one
    server.run()
    if not server.started:
        raise SystemExit(1)


class PortsReportingServer(uvicorn.Server):
    """A uvicorn server that, once REST and gRPC both listen, logs the ports they bound and writes them
    to settings.ports_file: with port 0 the kernel picks them, so no one races for a free port."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, settings: Settings) -> None:
        super().__init__(config)
        self.app = app
        self.settings = settings

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)  # the lifespan (which starts gRPC) runs first, then REST binds
        if not self.started:
            return
        http_port = self.servers[0].sockets[0].getsockname()[1]
        grpc_port = self.app.state.grpc_port
        replica = self.app.state.wiring.replica  # its next beat names the addresses it serves
        host = self.settings.replica_address or _reachable(self.settings.http_host)
        replica.http_address = f"{host}:{http_port}"
        grpc_host = self.settings.replica_address or _reachable(self.settings.grpc_host)
        replica.grpc_address = f"{grpc_host}:{grpc_port}" if grpc_port else ""
        log.info(
            "listening: REST on %s:%d, gRPC on %s:%d",
            self.settings.http_host,
            http_port,
            self.settings.grpc_host,
            grpc_port,
        )
        if self.settings.ports_file is not None:
            write_ports_file(self.settings.ports_file, http_port, grpc_port)


def write_ports_file(path: Path, http_port: int, grpc_port: int) -> None:
    """Writes {"http": N, "grpc": M} to `path` atomically: a reader sees no file or the whole of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "w") as file:
            json.dump({"http": http_port, "grpc": grpc_port}, file)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def log_tls(settings: Settings, tls: TlsPlan) -> None:
    """Says what REST serves, and for a self-signed CA where it is and what agents and the CLI need."""
    if tls.http is None:
        warn_if_clear_text("the REST API and dashboard", settings.http_host, "--tls-cert/--tls-key")
    else:
        log.info("REST API and dashboard serve TLS with %s", tls.http.cert)
    signed = tls.self_signed
    if signed is None:
        return
    ca = signed.ca_cert.resolve()
    made = f"made now: {', '.join(signed.made)}" if signed.made else "reused"
    http_host, grpc_host = _reachable(settings.http_host), _reachable(settings.grpc_host)
    log.info(
        "self-signed TLS (%s): CA certificate %s\n"
        "  CA SHA-256 fingerprint: %s\n"
        "  agents:   mwms agent --server %s:%d --ca-file %s ...\n"
        "  CLI:      MWMS_CA_FILE=%s MWMS_API=https://%s:%d mwms ... (or --ca-file, --api)\n"
        "  browsers: trust %s (SHA-256 %s) for mwms only: its name constraints limit it to %s",
        made,
        ca,
        signed.ca_fingerprint,
        grpc_host,
        settings.grpc_port,
        ca,
        ca,
        http_host,
        settings.http_port,
        signed.browser_ca_cert.resolve(),
        signed.browser_ca_fingerprint,
        ", ".join(signed.permitted),
    )


def _reachable(host: str) -> str:
    # A wildcard address is not something to dial: show this machine's name instead.
    if host in ("", "0.0.0.0", "::", "[::]"):
        return socket.gethostname()
    return f"[{host}]" if ":" in host and not host.startswith("[") else host

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

from mwms import agent_defaults
from mwms.log_setup import configure_logging
from mwms.private_files import ForeignFileError, refuse_foreign_dir, secure_data_dir, set_private_umask
from mwms.server.app import create_app
from mwms.server.db.single_instance import AlreadyRunning, SingleInstanceLock
from mwms.server.heap import settle_heap
from mwms.server.http_protocol import bounded_http_protocol
from mwms.server.limits import HttpBounds
from mwms.server.listen_ports import CannotListen, check_grpc_port_free, claim_http_socket
from mwms.server.open_files import raise_open_files_limit
from mwms.server.settings import Settings
from mwms.server.tls import TlsError, TlsPlan, plan_tls, warn_if_clear_text

log = logging.getLogger("mwms.server")
# Seconds a stop waits for open requests (log follows) before closing them.
SHUTDOWN_GRACE_S = 3


def serve(settings: Settings) -> None:
    """Blocks serving the coordinator; SIGINT/SIGTERM stop it cleanly."""
    # One handler and format for every logger, uvicorn's and gRPC's included (mwms/log_setup.py).
    configure_logging(settings.log_format, settings.log_level)
    raise_open_files_limit()  # one descriptor per agent stream (server/open_files.py)
    # Before anything is written: the self-signed CA's keys, the database and its -wal/-shm are then
    # this user's alone whatever umask started us, and a data dir of another user's is never used.
    set_private_umask()
    _lower_oom_score()
    try:
        refuse_foreign_dir(settings.data_dir)
        tls = plan_tls(settings)
        secure_data_dir(settings.data_dir, settings.database_url)
    except (TlsError, ForeignFileError) as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    log_tls(settings, tls)
    if settings.ports_file is not None:
        settings.ports_file.unlink(missing_ok=True)  # whoever waits for it must never read an old one
    single = SingleInstanceLock(settings.database_url)
    try:
        single.acquire()
    except AlreadyRunning as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    try:  # both ports before the lifespan: a taken one stops the start before any "ready" line
        http_socket = claim_http_socket(settings.http_host, settings.http_port)
        if settings.serve != "api":
            check_grpc_port_free(settings.grpc_host, settings.grpc_port)
    except CannotListen as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    app = create_app(settings, single_instance=False)
    config = uvicorn.Config(
        app,
        host=settings.http_host,
        port=settings.http_port,
        # uvicorn's loggers keep no handlers or levels of their own: they write through configure_logging's.
        # No access log: request lines would carry query strings, and the dashboard's login paths.
        log_config=None,
        log_level=None,
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
    server.run(sockets=[http_socket])
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
        if sockets:  # uvicorn says where it runs only when it bound the socket itself
            self._log_started_message(sockets)
        http_port = self.servers[0].sockets[0].getsockname()[1]
        grpc_port = self.app.state.grpc_port
        replica = self.app.state.wiring.replica  # its next beat names the addresses it serves
        host = self.settings.replica_address or _reachable(self.settings.http_host)
        replica.http_address = f"{host}:{http_port}"
        grpc_host = self.settings.replica_address or _reachable(self.settings.grpc_host)
        replica.grpc_address = f"{grpc_host}:{grpc_port}" if grpc_port else ""
        log.info(
            "coordinator ready: REST on %s:%d, gRPC for agents on %s:%d",
            self.settings.http_host,
            http_port,
            self.settings.grpc_host,
            grpc_port,
        )
        if self.settings.ports_file is not None:
            write_ports_file(self.settings.ports_file, http_port, grpc_port)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # gRPC health says NOT_SERVING as the stop begins, not after REST has drained (up to
        # SHUTDOWN_GRACE_S): probes and load balancers stop sending agents here at once.
        grpc_health = getattr(self.app.state, "grpc_health", None)  # None: an `--serve api` replica
        if grpc_health is not None:
            await grpc_health.stopping()
        await super().shutdown(sockets)


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
    # One record per line: log shippers and the one-line formats (mwms/log_setup.py) keep each readable.
    log.info("self-signed TLS (%s): CA certificate %s", made, ca)
    log.info("self-signed TLS: CA SHA-256 fingerprint: %s", signed.ca_fingerprint)
    log.info(
        "self-signed TLS: agents: mwms agent --server %s:%d --ca-file %s ...",
        grpc_host,
        settings.grpc_port,
        ca,
    )
    log.info(
        "self-signed TLS: CLI: MWMS_CA_FILE=%s MWMS_API=https://%s:%d mwms ... (or --ca-file, --api)",
        ca,
        http_host,
        settings.http_port,
    )
    log.info(
        "self-signed TLS: browsers: trust %s (SHA-256 %s) for mwms only: its name constraints limit it to %s",
        signed.browser_ca_cert.resolve(),
        signed.browser_ca_fingerprint,
        ", ".join(signed.permitted),
    )


def _reachable(host: str) -> str:
    # A wildcard address is not something to dial: show this machine's name instead.
    if host in ("", "0.0.0.0", "::", "[::]"):
        return socket.gethostname()
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _lower_oom_score() -> None:
    """On a machine that also runs an agent, the out-of-memory killer takes tasks (1000) before the
    coordinator; only a privileged coordinator may lower its score (its unit sets OOMScoreAdjust= instead)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write(str(agent_defaults.AGENT_OOM_SCORE_ADJ))
    except OSError:
        pass

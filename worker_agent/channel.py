"""The agent's channel to the coordinator: TLS or clear text, keepalive, and its credential on every call."""

from __future__ import annotations

import logging

import grpc

from worker_agent.config import AgentConfig
from worker_agent.credentials import CredentialInterceptor, CredentialStore

log = logging.getLogger("mwms.agent.channel")

# The channel's own reconnect backoff (default: up to 120 s) must not outlast the agent's Backoff.
# Keepalive pings notice a silently dropped network (no RST, no FIN) within about 15 s; the coordinator
# accepts a ping every 5 s, also while no call is open.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 10_000),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
LOOPBACK_HOSTS = ("localhost", "::1")


class ChannelFactory:
    """Opens channels to the coordinator the way the config says; the CA file is read once, at start."""

    def __init__(self, config: AgentConfig, credential: CredentialStore) -> None:
        self._server = config.server
        self._interceptor = CredentialInterceptor(credential)
        self._tls: grpc.ChannelCredentials | None = None
        if config.ca_file is not None:
            self._tls = grpc.ssl_channel_credentials(root_certificates=config.ca_file.read_bytes())
        elif config.tls:
            self._tls = grpc.ssl_channel_credentials()  # gRPC's bundled public roots
        elif not is_loopback(config.server):
            log.warning(
                "talking to %s in clear text: the join token and the agent credential can be read on the "
                "network; serve gRPC with TLS and start the agent with --ca-file (or --tls)",
                config.server,
            )

    def open(self) -> grpc.Channel:
        if self._tls is not None:
            channel = grpc.secure_channel(self._server, self._tls, options=CHANNEL_OPTIONS)
        else:
            channel = grpc.insecure_channel(self._server, options=CHANNEL_OPTIONS)
        return grpc.intercept_channel(channel, self._interceptor)


def is_loopback(server: str) -> bool:
    host = server.rsplit(":", 1)[0].strip("[]")
    return host in LOOPBACK_HOSTS or host.startswith("127.")

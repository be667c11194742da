"""The agent's channel to the coordinator: TLS or clear text, keepalive, and its credential on every call."""

from __future__ import annotations

import logging

import grpc

from mwms.agent_link import channel_options
from mwms.loopback import is_loopback_address
from worker_agent.config import AgentConfig
from worker_agent.credentials import CredentialInterceptor, CredentialStore

log = logging.getLogger("mwms.agent.channel")

# The channel's own reconnect backoff (default: up to 120 s) must not outlast the agent's Backoff.
# The receive limit and the keepalive pings are agreed with the coordinator (mwms/agent_link.py).
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 10_000),
    *channel_options(),
]


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
        elif not is_loopback_address(config.server):
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

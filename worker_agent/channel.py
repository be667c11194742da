"""The agent's channel to the coordinator: TLS or clear text, keepalive, and its credential on every call;
and, when the coordinator runs as several replicas, which of them the agent talks to.

Replicas share one database, so any of them serves the agent equally. The agent holds one channel to one
replica at a time (`ServerRotation.current`): the first of the list at start, the next one (round-robin)
each time registering fails or the stream breaks, and it stays on a replica that works. A fresh channel is
opened for each move; TLS uses the same CA for every replica and verifies each against its own host name
(gRPC takes the name from the target, nothing overrides it).

One address that is a DNS name with several A/AAAA records is left to gRPC: the channel's `dns:` resolver
hands all of them to pick_first, which tries them in order and, when the connected one fails, re-resolves
and connects to the next one that answers. Nothing here pins a resolved IP or sets a load-balancing policy,
so that keeps working.
"""

from __future__ import annotations

import logging

import grpc

from mwms.agent_link import channel_options
from mwms.loopback import is_loopback_address
from mwms.worker_agent.config import AgentConfig
from mwms.worker_agent.credentials import CredentialInterceptor, CredentialStore

log = logging.getLogger("mwms.agent.channel")

# The channel's own reconnect backoff (default: up to 120 s) must not outlast the agent's Backoff
# (worker_agent/main.py, at most 3 s + jitter): a replica that comes back is tried again as soon as the
# agent would try it. gRPC also uses the minimum as the connect timeout, so an address that drops SYNs
# fails within about half a second instead of the default 20 s. The receive limit and the keepalive
# pings are agreed with the coordinator (mwms/agent_link.py).
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 3_000),
    *channel_options(),
]


class ChannelFactory:
    """Opens channels to the coordinator's replicas the way the config says; the CA file is read once."""

    def __init__(self, config: AgentConfig, credential: CredentialStore) -> None:
        self._interceptor = CredentialInterceptor(credential)
        self._tls: grpc.ChannelCredentials | None = None
        if config.ca_file is not None:
            self._tls = grpc.ssl_channel_credentials(root_certificates=config.ca_file.read_bytes())
        elif config.tls:
            self._tls = grpc.ssl_channel_credentials()  # gRPC's bundled public roots
        else:
            exposed = [address for address in config.servers if not is_loopback_address(address)]
            if exposed:
                log.warning(
                    "talking to %s in clear text: the join token and the agent credential can be read on "
                    "the network; serve gRPC with TLS and start the agent with --ca-file (or --tls)",
                    ", ".join(exposed),
                )

    def open(self, address: str) -> grpc.Channel:
        """A new channel to `address` ("host:port"), presenting the agent's credential on every call."""
        if self._tls is not None:
            channel = grpc.secure_channel(address, self._tls, options=CHANNEL_OPTIONS)
        else:
            channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        return grpc.intercept_channel(channel, self._interceptor)


class ServerRotation:
    """The coordinator replica the agent talks to now, and the order it moves through them (round-robin)."""

    def __init__(self, addresses: tuple[str, ...]) -> None:
        if not addresses:
            raise ValueError("no coordinator address")
        self._addresses = addresses
        self._index = 0

    def __len__(self) -> int:
        return len(self._addresses)

    @property
    def current(self) -> str:
        return self._addresses[self._index]

    def advance(self) -> str:
        """Moves to the next replica (after the last: the first) and returns its address."""
        self._index = (self._index + 1) % len(self._addresses)
        return self.current

    def describe(self) -> str:
        """The current replica for the log: "b:50051 (2 of 3)", or just the address when there is one."""
        if len(self._addresses) == 1:
            return self.current
        return f"{self.current} ({self._index + 1} of {len(self._addresses)})"

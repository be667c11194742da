"""What the coordinator's gRPC server and the agents' channel agree on: message size, keepalive, flow control.

- ``AGENT_RECEIVE_LIMIT_BYTES``: the largest message an agent's channel takes (gRPC's default, set
  explicitly by worker_agent/channel.py). The coordinator never sends a StartTask over it
  (server/rpc/agent_stream.py) and its settings refuse job limits that could (server/limits.py).
- ``MAX_DEVICES_PER_MESSAGE``: the GPUs one device telemetry message may describe.
- Keepalive: the agent pings every ``CLIENT_PING_INTERVAL_MS``, also while no call is open, and drops a
  link whose ping is not answered within ``CLIENT_PING_TIMEOUT_MS``, so a silently lost network (no RST,
  no FIN) is noticed within about 15 s. The coordinator accepts a ping every
  ``SERVER_MIN_PING_INTERVAL_MS`` without data; a client that pings more often earns a strike, and after
  ``SERVER_MAX_PING_STRIKES`` the server closes the connection (GOAWAY "too_many_pings"). So the
  client's interval must be at least the server's minimum (``client_pings_allowed``, tested).
  The server pings its side every ``SERVER_PING_INTERVAL_MS`` too.
- Flow control (``flow_control_options``, both sides): a fixed window of ``STREAM_WINDOW_BYTES`` a stream,
  without gRPC's bandwidth-delay probes. Those pinged the other side on nearly every message received: with
  1,000 agents heartbeating at 1 Hz, a ping and its ack per heartbeat, twice the coordinator's sendmsg calls
  and three times its futex calls; without them the coordinator took 26-31 % of a core instead of 32-47 %,
  the agents' side 25-28 % instead of 30-42 % (bench/README.md, Agents). The window caps one stream at
  STREAM_WINDOW_BYTES a round trip: 4 GB/s at 1 ms, 400 MB/s at 10 ms, for a bundle or checkpoint; and it
  bounds what one stream may have in flight towards a reader that is not reading.

The option lists are plain (name, value) pairs; only the two sides add them to gRPC.
Dependency-free (standard library only).
"""

from __future__ import annotations

AGENT_RECEIVE_LIMIT_BYTES = 4 * 1024 * 1024
# GPUs one DeviceTelemetry message may sample: the agent sends no more, the coordinator refuses more.
MAX_DEVICES_PER_MESSAGE = 64

CLIENT_PING_INTERVAL_MS = 10_000
CLIENT_PING_TIMEOUT_MS = 5_000
SERVER_PING_INTERVAL_MS = 10_000
SERVER_MIN_PING_INTERVAL_MS = 5_000
SERVER_MAX_PING_STRIKES = 2  # gRPC's default, stated so the agreement is written down in one place

STREAM_WINDOW_BYTES = 4 * 1024 * 1024


def flow_control_options() -> list[tuple[str, int]]:
    """Both sides: a fixed stream window, no bandwidth-delay probe pings."""
    return [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", STREAM_WINDOW_BYTES)]


def channel_options() -> list[tuple[str, int]]:
    """The agent channel's side: its receive limit and keepalive pings (also without calls)."""
    return [
        ("grpc.max_receive_message_length", AGENT_RECEIVE_LIMIT_BYTES),
        ("grpc.keepalive_time_ms", CLIENT_PING_INTERVAL_MS),
        ("grpc.keepalive_timeout_ms", CLIENT_PING_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),  # 0: no cap on pings between data frames
        *flow_control_options(),
    ]


def server_keepalive_options() -> list[tuple[str, int]]:
    """The coordinator's side: its own pings, the ping policy the agents' pings must pass, flow control."""
    return [
        ("grpc.keepalive_time_ms", SERVER_PING_INTERVAL_MS),
        ("grpc.http2.min_ping_interval_without_data_ms", SERVER_MIN_PING_INTERVAL_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_ping_strikes", SERVER_MAX_PING_STRIKES),
        *flow_control_options(),
    ]


def client_pings_allowed(client: list[tuple[str, int]], server: list[tuple[str, int]]) -> bool:
    """Whether a channel with `client` options pings no more often than a server with `server` allows."""
    client_opts, server_opts = dict(client), dict(server)
    interval = client_opts.get("grpc.keepalive_time_ms")
    if interval is None:
        return True  # a channel that never pings
    minimum = server_opts.get("grpc.http2.min_ping_interval_without_data_ms", 5 * 60 * 1000)
    if interval < minimum:
        return False
    # Pings with no call open are allowed only when the server permits them.
    return not client_opts.get("grpc.keepalive_permit_without_calls") or bool(
        server_opts.get("grpc.keepalive_permit_without_calls")
    )

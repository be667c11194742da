"""Naming the mix-up when `--server` points at an HTTP/1.x server instead of the coordinator's gRPC port.

Rules:
- gRPC reports such an address as UNAVAILABLE with "Trying to connect an http1.x server" (or "Failed
  parsing HTTP/2"); only errors saying that are explained, every other error keeps gRPC's own words.
- The explanation is one sentence naming the address, what it is, and what to pass instead. When the
  address answers GET /healthz with the coordinator's JSON, it is the coordinator's REST port and the
  sentence names the gRPC port that /healthz reports ("grpc_port"); otherwise it names the default.
- The agent retries as it does for any address that does not answer gRPC (a replica list may hold a
  wrong entry while the others work); the sentence replaces gRPC's raw error in each retry's warning.
"""

from __future__ import annotations

import httpx

DEFAULT_GRPC_PORT = 50051  # server/settings.py grpc_port
HTTP1_SIGNS = ("http1.x server", "Failed parsing HTTP/2")
PROBE_TIMEOUT_S = 2.0


def answers_http1(details: str) -> bool:
    """True when a gRPC error's details say the address answered HTTP/1.x."""
    return any(sign in details for sign in HTTP1_SIGNS)


def http1_server_sentence(address: str) -> str:
    """The one sentence for an agent whose --server `address` answers HTTP/1.x."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    grpc_port = coordinator_grpc_port(address)
    if grpc_port is None:
        return (
            f"{address} answers HTTP/1.x, not gRPC: --server must name the coordinator's gRPC port for "
            f"agents (default {DEFAULT_GRPC_PORT}, `mwms server --grpc-port`), not an HTTP port"
        )
    return (
        f"{address} is the coordinator's HTTP port (REST and dashboard), not its gRPC port for agents: "
        f"pass --server {host}:{grpc_port}"
    )


def coordinator_grpc_port(address: str) -> int | None:
    """The gRPC port the coordinator's /healthz at `address` reports; None when it reports none."""
    try:
        response = httpx.get(f"http://{address}/healthz", timeout=PROBE_TIMEOUT_S, trust_env=False)
        port = int(response.json()["grpc_port"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None
    return port if port > 0 else None

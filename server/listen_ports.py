"""The coordinator's two listening ports, claimed before anything says "ready" (issue 31).

Rules:
- REST's socket is bound and listening before the lifespan starts (uvicorn then serves on it), so a
  taken --http-port stops the start before gRPC, the database or any "ready" line.
- gRPC's port is tried the same way first (bound without SO_REUSEPORT, then closed: grpc must bind it
  itself), and gRPC binds with `grpc.so_reuseport` off, so a second coordinator on the same --grpc-port
  is refused instead of sharing the agents with the first at random.
- A taken port is one sentence naming the port and the flag to change: `CannotListen`; so is an
  address this machine cannot bind (naming --http-host / --grpc-host).
- Port 0 is never taken: the kernel picks a free one.
"""

from __future__ import annotations

import errno
import socket


class CannotListen(Exception):
    """A port the coordinator must listen on is taken (or its address is not this machine's); the
    message names it and the flag to change."""


def port_in_use_message(what: str, host: str, port: int, flag: str) -> str:
    """The one sentence for a taken port."""
    return (
        f"cannot listen for {what} on {host or '0.0.0.0'}:{port}: the port is in use "
        f"(is another mwms server running?); stop that process or pass another {flag}"
    )


def cannot_bind_message(what: str, host: str, port: int, error: OSError, flag: str) -> str:
    """The one sentence for an address that cannot be bound for another reason than a taken port."""
    return f"cannot listen for {what} on {host or '0.0.0.0'}:{port}: {error.strerror or error}; check {flag}"


def claim_http_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port and listening, for uvicorn to serve on; CannotListen when taken."""
    family, address = _address(host, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # SO_REUSEADDR, as uvicorn sets it: a restart binds at once past TIME_WAIT. Never SO_REUSEPORT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)  # listening at once: a second bind with SO_REUSEADDR is refused from now on
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise CannotListen(
                port_in_use_message("REST and the dashboard", host, port, "--http-port")
            ) from None
        raise CannotListen(
            cannot_bind_message("REST and the dashboard", host, port, error, "--http-host")
        ) from None
    sock.set_inheritable(True)
    return sock


def check_grpc_port_free(host: str, port: int) -> None:
    """Raises CannotListen when host:port cannot be bound for gRPC now (port 0: always free)."""
    if port == 0:
        return
    family, address = _address(host, port)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpc sets it
        try:
            sock.bind(address)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise CannotListen(port_in_use_message("agents (gRPC)", host, port, "--grpc-port")) from None
            raise CannotListen(
                cannot_bind_message("agents (gRPC)", host, port, error, "--grpc-host")
            ) from None


def _address(host: str, port: int) -> tuple[socket.AddressFamily, tuple[str, int]]:
    # As uvicorn binds: IPv6 for an address with a colon, IPv4 for anything else (names included).
    bare = host.strip("[]")
    if ":" in bare:
        return socket.AF_INET6, (bare, port)
    return socket.AF_INET, (bare or "0.0.0.0", port)

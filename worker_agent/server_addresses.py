"""The coordinator's addresses an agent is given: `parse_servers`, the one place that says what an
address list ("host:port", comma-separated, one per coordinator replica) may hold, and the local address
the OS would use to reach one. Standard library only (worker_agent/config.py's docstring says why)."""

from __future__ import annotations

import ipaddress
import re
import socket

from mwms import agent_defaults as defaults

# A DNS name: labels of letters, digits, '-' and '_' (seen in internal names), dot-separated; IPv4 fits too.
_HOSTNAME = re.compile(
    r"(?=.{1,253}\.?$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
    r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?"
)
_EXAMPLES = "write HOST:PORT, e.g. 10.0.0.5:50051, coord-a.example.com:50051 or [fd00::5]:50051"


def parse_servers(text: str) -> tuple[str, ...]:
    """The coordinator addresses in `text` ("host:port", comma-separated), in order.

    Raises ValueError naming the entry that is wrong and what to write instead. A name that resolves to
    several addresses is one entry: gRPC resolves it and tries its addresses in turn (pick_first).
    """
    entries = [entry.strip() for entry in text.split(",")]
    if entries == [""]:
        raise ValueError(f"no coordinator address given: {_EXAMPLES}")
    if len(entries) > defaults.MAX_SERVERS:
        raise ValueError(
            f"{len(entries)} coordinator addresses given, at most {defaults.MAX_SERVERS} are allowed: "
            "list the replicas only, or one DNS name that resolves to all of them"
        )
    seen: set[str] = set()
    for number, entry in enumerate(entries, start=1):
        if not entry:
            raise ValueError(
                f"address {number} of {text.strip()!r} is empty: separate addresses with single commas, "
                "e.g. a:50051,b:50051"
            )
        _check_address(entry)
        if entry in seen:
            raise ValueError(f"{entry!r} is listed twice: give each coordinator replica once")
        seen.add(entry)
    return tuple(entries)


def _check_address(entry: str) -> None:
    """Raises ValueError unless `entry` is HOST:PORT (an IPv6 host in brackets)."""
    if "/" in entry:
        raise ValueError(
            f"{entry!r} is not HOST:PORT: give the gRPC address without a scheme or path; {_EXAMPLES}"
        )
    if entry.startswith("["):
        host, bracket, port = entry[1:].partition("]")
        if not bracket or not port.startswith(":"):
            raise ValueError(f"{entry!r} is not [IPV6]:PORT: write e.g. [{host}]:50051")
        port = port[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{entry!r}: {host!r} is not an IPv6 address; {_EXAMPLES}") from None
    else:
        host, colon, port = entry.rpartition(":")
        if not colon:
            raise ValueError(f"{entry!r} has no port: write HOST:PORT, e.g. {entry}:50051")
        if ":" in host:
            raise ValueError(f"{entry!r}: an IPv6 address goes in brackets, e.g. {_bracketed(entry)}")
        if not _HOSTNAME.fullmatch(host):
            raise ValueError(f"{entry!r}: {host!r} is not a host name or IP address; {_EXAMPLES}")
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"{entry!r}: the port {port!r} is not a number from 1 to 65535; {_EXAMPLES}")


def _bracketed(entry: str) -> str:
    """What an unbracketed IPv6 entry should have been: the whole entry as the host when it is an
    address (no port can be told apart then), else the part before the last colon."""
    try:
        return f"[{ipaddress.IPv6Address(entry)}]:50051"
    except ValueError:
        host, _, port = entry.rpartition(":")
        return f"[{host}]:{port}"


def local_address_towards(server: str) -> str:
    """The local IP the OS would use to reach `server` ("host:port"); 127.0.0.1 for a loopback server."""
    host = server.rsplit(":", 1)[0].strip("[]")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            # A UDP connect sends nothing; it only asks the kernel which route (and source IP) it would use.
            probe.connect((host, 9))
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"

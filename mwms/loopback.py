"""Which hosts are this machine's loopback: one rule for the coordinator and the agent.

Both warn when they would talk (or listen) in clear text on an address other machines can reach, and
say nothing on loopback. A host is loopback when it is one of ``LOOPBACK_HOSTS`` (case-insensitive,
IPv6 brackets allowed) or an address in 127.0.0.0/8; anything else (``0.0.0.0``, ``""`` for all
addresses, a hostname) is not.

Dependency-free (standard library only).
"""

from __future__ import annotations

import ipaddress

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, IPv6 with or without brackets) is this machine's loopback."""
    bare = host.strip().strip("[]").lower()
    if bare in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def host_of(address: str) -> str:
    """The host of "host:port" ("[::1]:50051" -> "::1"); an address without a port is its own host."""
    text = address.strip()
    if text.startswith("["):
        return text[1:].split("]", 1)[0]
    if text.count(":") == 1:
        return text.rsplit(":", 1)[0]
    return text  # a bare host, IPv6 ones included


def is_loopback_address(address: str) -> bool:
    """Whether the host of `address` ("host:port") is loopback."""
    return is_loopback(host_of(address))

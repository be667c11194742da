"""Linux network namespaces on a private bridge, so end-to-end tests can give each agent its own address
and cut one machine's link while everything else keeps running.

Needs root (CAP_NET_ADMIN) and iproute2; `require_netns()` skips the calling test with the reason when
either is missing. Every name carries a random run id, so parallel or leftover runs cannot collide, and
everything is deleted on `teardown()` and again at interpreter exit.

The namespaces get only their /24 on the bridge, no default route: traffic can reach the bridge address
(the root namespace), the other namespaces and loopback, and nothing else.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import random
import secrets
import shutil
import signal
import subprocess
from dataclasses import dataclass, field

import pytest

SUBNET_POOL = ipaddress.ip_network("10.231.0.0/16")
FIRST_HOST = 10


class NetnsUnavailable(Exception):
    """Namespaces or the bridge cannot be made here; the message says why."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise NetnsUnavailable(f"`ip {' '.join(args)}` failed: {result.stderr.strip() or result.returncode}")
    return result


def _ensure_iproute2() -> None:
    if shutil.which("ip"):
        return
    if shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-q", "iproute2"], capture_output=True, timeout=300)
    if not shutil.which("ip"):
        raise NetnsUnavailable("the `ip` command (iproute2) is missing and could not be installed")


def _used_subnets() -> set[int]:
    """Third octets of 10.231.x.0/24 networks that already have an address or route in this namespace."""
    text = _ip("-4", "-o", "addr", "show").stdout + _ip("-4", "route", "show", "table", "all").stdout
    used = set()
    for word in text.replace("/", " ").split():
        try:
            address = ipaddress.ip_address(word)
        except ValueError:
            continue
        if address in SUBNET_POOL:
            used.add(int(address.packed[2]))
    return used


def _pids_in(ns: str) -> list[int]:
    result = _ip("netns", "pids", ns, check=False)
    return [int(word) for word in result.stdout.split() if word.isdigit()]


@dataclass
class Netns:
    """A bridge in the root namespace (x.x.n.1/24) and `count` namespaces, namespace i at x.x.n.(10+i)."""

    count: int
    run_id: str = field(default_factory=lambda: secrets.token_hex(2))
    subnet: int = 0
    created_bridge: bool = False
    namespaces: list[str] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"mwmsbr{self.run_id}"

    @property
    def bridge_address(self) -> str:
        return f"10.231.{self.subnet}.1"

    def name(self, i: int) -> str:
        return f"mwms-{self.run_id}-{i}"

    def address(self, i: int) -> str:
        return f"10.231.{self.subnet}.{FIRST_HOST + i}"

    def host_veth(self, i: int) -> str:
        return f"mwv{self.run_id}h{i}"

    def create(self) -> Netns:
        """Makes the bridge and namespaces; on any failure removes what it made and raises NetnsUnavailable."""
        atexit.register(self.teardown)
        try:
            free = sorted(set(range(1, 255)) - _used_subnets())
            if not free:
                raise NetnsUnavailable(f"every /24 in {SUBNET_POOL} is in use")
            self.subnet = random.choice(free)
            _ip("link", "add", self.bridge, "type", "bridge")
            self.created_bridge = True
            _ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(self.count):
                self._add_namespace(i)
        except BaseException:
            self.teardown()
            raise
        return self

    def _add_namespace(self, i: int) -> None:
        ns, host = self.name(i), self.host_veth(i)
        _ip("netns", "add", ns)
        self.namespaces.append(ns)
        _ip("link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", host, "master", self.bridge)
        _ip("link", "set", host, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")

    def run_in(self, i: int, argv: list[str]) -> list[str]:
        """`argv` prefixed so that it runs inside namespace i."""
        return ["ip", "netns", "exec", self.name(i), *argv]

    def cut(self, i: int) -> None:
        """Takes namespace i off the network: the host end of its veth goes down.

        Nothing is reset or refused; the bridge stops forwarding to it and its packets are dropped. The
        namespace's end loses carrier, so its kernel forgets its neighbours and new connections fail with
        "No route to host", as on a machine whose cable was pulled. (A silent drop further away, where the
        agent would only notice through keepalives, needs iptables, nft, tc drop actions or bridge port
        states; none of them is available in every sandbox this runs in.)
        """
        _ip("link", "set", self.host_veth(i), "down")

    def restore(self, i: int) -> None:
        """Puts namespace i back on the bridge."""
        _ip("link", "set", self.host_veth(i), "up")

    def pids(self, i: int) -> list[int]:
        """Pids of processes running in namespace i."""
        return _pids_in(self.name(i))

    def teardown(self) -> None:
        """Kills what still runs in the namespaces (only ever processes the tests started there) and
        deletes namespaces (with their veths) and the bridge; safe to call more than once."""
        for i, ns in enumerate(list(self.namespaces)):
            for pid in _pids_in(ns):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            # Deleting the host end removes the pair now; a deleted namespace frees its veth only later.
            _ip("link", "del", self.host_veth(i), check=False)
            _ip("netns", "del", ns, check=False)
            self.namespaces.remove(ns)
        if self.created_bridge:
            _ip("link", "del", self.bridge, check=False)
            self.created_bridge = False


def require_netns(count: int) -> Netns:
    """Creates `count` namespaces on a fresh bridge, or skips the test with the reason it cannot."""
    if os.geteuid() != 0:
        pytest.skip("network-namespace tests need root (CAP_NET_ADMIN) to create namespaces and a bridge")
    try:
        _ensure_iproute2()
        return Netns(count).create()
    except NetnsUnavailable as error:
        pytest.skip(f"cannot create network namespaces here: {error}")

"""What an agent is told at start: where the coordinator is, who it is, where it keeps its files.

The coordinator may run as several replicas on one database; the agent is then given all their gRPC
addresses, comma-separated ("a:50051,b:50051"), and talks to one at a time (worker_agent/channel.py
ServerRotation). `parse_servers` is the one place that says what an address list may hold; the CLI calls
it before starting, so a typo is reported at once instead of as an endless reconnect.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

from mwms import agent_defaults as defaults

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
RESERVED_PORTS_FILE = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")
MAX_PROC_FILE_BYTES = 65536
LOWEST_UNPRIVILEGED_PORT = 1024


@dataclass(frozen=True)
class AgentConfig:
    """Settings for one agent process; built by the CLI (or a test) and passed to `run_agent`.

    The defaults are mwms/agent_defaults.py's; `mwms agent` passes only the options a user gave."""

    # "host:port" of the coordinator's gRPC endpoint, or several (replicas) separated by commas.
    server: str
    name: str
    work_dir: Path
    slots: int = defaults.SLOTS
    # True when --slots was given: an agent without GPUs then offers CPU slots without a warning.
    slots_given: bool = False
    # Empty: the local IP the OS uses to reach the coordinator (see `local_address_towards`).
    advertise_address: str = ""
    port_low: int = defaults.PORT_LOW
    port_high: int = defaults.PORT_HIGH
    join_token: str = ""
    # Seconds between SIGTERM and SIGKILL when the agent itself shuts its tasks down.
    stop_grace: float = defaults.STOP_GRACE_S
    # TLS to the coordinator: verified against this CA certificate (PEM), or, with `tls`, public CAs.
    ca_file: Path | None = None
    tls: bool = False
    # Seconds between two samples of the GPUs' utilisation, memory and temperature; 0: none.
    device_sample_interval: float = defaults.DEVICE_SAMPLE_INTERVAL_S
    # How tasks are confined (worker_agent/sandbox.py): "auto" (bubblewrap when installed), "bwrap", "off".
    sandbox: str = defaults.SANDBOX
    # Who tasks run as when the agent is root (worker_agent/task_users.py): one user for every task
    # (a name or uid), or else one uid per concurrent task from this inclusive range.
    task_user: str | None = None
    task_uids: tuple[int, int] = (defaults.TASK_UID_LOW, defaults.TASK_UID_HIGH)
    # Jobs' own Python environments, built with uv under <work dir>/envs: the cache's size in bytes
    # (least recently used evicted first, never one in use; 0: unbounded) and one build's time limit.
    env_cache_bytes: int = defaults.ENV_CACHE_BYTES
    # Where they are kept; None: <work dir>/envs. Agents on one machine may share one (builds are locked).
    env_cache_dir: Path | None = None
    env_build_timeout: float = defaults.ENV_BUILD_TIMEOUT_S
    # Whether uv may build a source distribution (its build script, a job's choice, then runs as the agent).
    env_source_builds: bool = False
    # Each task's processes and threads, and the size of its files (0: no limit).
    task_pids_max: int = defaults.TASK_PIDS_MAX
    task_disk_max: int = defaults.TASK_DISK_MAX
    # `server` parsed: the addresses in order (ValueError at construction when one is malformed).
    servers: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "servers", parse_servers(self.server))

    def __repr__(self) -> str:
        # The join token is a secret: keep it out of logs and tracebacks (the credential never is in here).
        return (
            f"AgentConfig(server={self.server!r}, name={self.name!r}, work_dir={str(self.work_dir)!r}, "
            f"slots={self.slots}, advertise_address={self.advertise_address!r}, "
            f"ports={self.port_low}-{self.port_high}, stop_grace={self.stop_grace}, "
            f"ca_file={str(self.ca_file) if self.ca_file else None!r}, tls={self.tls or self.ca_file is not None}, "
            f"sandbox={self.sandbox!r}, task_user={self.task_user!r}, task_uids={self.task_uids})"
        )


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


def _read_small(path: Path) -> str:
    with path.open() as file:
        return file.read(MAX_PROC_FILE_BYTES)


def _parse_port_set(text: str) -> set[int]:
    """The ports of ip_local_reserved_ports' "8080,9000-9010" form (an empty text: none)."""
    ports: set[int] = set()
    for part in text.replace("\n", ",").split(","):
        low, _, high = part.strip().partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            ports.update(range(int(low), int(high or low) + 1))
    return ports


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The kernel's range of ports for outgoing connections (Linux), or None where it cannot be read."""
    try:
        low, high = (int(value) for value in _read_small(path).split())
    except (OSError, ValueError):
        return None
    return low, high


def ephemeral_overlap_warning(
    port_low: int,
    port_high: int,
    ephemeral: tuple[int, int] | None,
    reserved: set[int] | frozenset[int] = frozenset(),
) -> str:
    """A warning when the tasks' port range shares ports with the kernel's ephemeral range (and they are not
    reserved): any process's outgoing connection may take such a port, and a task that finds its port
    taken costs the job a re-placement. Empty when there is no overlap. It names a range to use instead."""
    if ephemeral is None:
        return ""
    eph_low, eph_high = ephemeral
    clash = [p for p in range(max(port_low, eph_low), min(port_high, eph_high) + 1) if p not in reserved]
    if not clash:
        return ""
    size = port_high - port_low + 1
    instead = _range_outside(size, eph_low, eph_high)
    advice = f"pass --port-range {instead[0]}-{instead[1]} instead" if instead else "pass a range outside it"
    return (
        f"the task port range {port_low}-{port_high} lies inside this machine's ephemeral port range "
        f"{eph_low}-{eph_high} (/proc/sys/net/ipv4/ip_local_port_range), from which any process's outgoing "
        f"connections take ports: {len(clash)} of its ports may be taken when a task needs one, and the job is "
        f"then placed again; {advice} (or reserve these ports in net.ipv4.ip_local_reserved_ports)"
    )


def _range_outside(size: int, eph_low: int, eph_high: int) -> tuple[int, int] | None:
    """A range of `size` ports outside [eph_low, eph_high]: the default one when it fits, else just below,
    else just above the ephemeral range."""
    if defaults.PORT_HIGH < eph_low or defaults.PORT_LOW > eph_high:
        if defaults.PORT_HIGH - defaults.PORT_LOW + 1 >= size:
            return defaults.PORT_LOW, defaults.PORT_LOW + size - 1
    if eph_low - size >= LOWEST_UNPRIVILEGED_PORT:
        start = max(LOWEST_UNPRIVILEGED_PORT, min(defaults.PORT_LOW, eph_low - size))
        return start, start + size - 1
    if eph_high + size <= 65535:
        return eph_high + 1, eph_high + size
    return None


def port_range_warning(config: AgentConfig) -> str:
    """`ephemeral_overlap_warning` for this machine's kernel settings (empty off Linux)."""
    try:
        reserved = _parse_port_set(_read_small(RESERVED_PORTS_FILE))
    except OSError:
        reserved = set()
    return ephemeral_overlap_warning(config.port_low, config.port_high, ephemeral_range(), reserved)

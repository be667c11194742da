"""The tasks' port range against the kernel's range of ports for outgoing connections (Linux): a warning
when they share ports, naming a range to use instead. Standard library only (worker_agent/config.py's
docstring says why)."""

from __future__ import annotations

from pathlib import Path

from mwms import agent_defaults as defaults

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
RESERVED_PORTS_FILE = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")
MAX_PROC_FILE_BYTES = 65536
LOWEST_UNPRIVILEGED_PORT = 1024


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

"""What an agent is told at start: where the coordinator is, who it is, where it keeps its files."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from mwms import agent_defaults as defaults


@dataclass(frozen=True)
class AgentConfig:
    """Settings for one agent process; built by the CLI (or a test) and passed to `run_agent`.

    The defaults are mwms/agent_defaults.py's; `mwms agent` passes only the options a user gave."""

    server: str  # "host:port" of the coordinator's gRPC endpoint
    name: str
    work_dir: Path
    slots: int = defaults.SLOTS
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

    def __repr__(self) -> str:
        # The join token is a secret: keep it out of logs and tracebacks (the credential never is in here).
        return (
            f"AgentConfig(server={self.server!r}, name={self.name!r}, work_dir={str(self.work_dir)!r}, "
            f"slots={self.slots}, advertise_address={self.advertise_address!r}, "
            f"ports={self.port_low}-{self.port_high}, stop_grace={self.stop_grace}, "
            f"ca_file={str(self.ca_file) if self.ca_file else None!r}, tls={self.tls or self.ca_file is not None}, "
            f"sandbox={self.sandbox!r}, task_user={self.task_user!r}, task_uids={self.task_uids})"
        )


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

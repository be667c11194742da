"""The local cluster `mwms quickstart` runs: a coordinator and two agents on this machine, started on ports
they pick (or from a random range), watched until online, and stopped again.

On Linux each agent advertises its own loopback address (127.0.0.1, 127.0.0.2: the kernel routes all of
127.0.0.0/8 to this machine), so a job's two workers are not co-located as TF_CONFIG shows them and each may
start in its agent's warm interpreter (worker_agent/warm_choice.py); elsewhere both advertise 127.0.0.1.

The coordinator gets an admin token and a join token through its environment (never its command line,
where `ps` shows them); the admin token is kept in <data dir>/admin-token (0600) for the dashboard's
log-in and for the CLI, and reused on the next run.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mwms.cli.errors import CliError, ExitCode
from mwms.cli.processes import ManagedProcess, last_lines, mwms_command, start_process, stop_processes
from mwms.client import Agent, Client
from mwms.connection import Connection

AGENT_NAMES = ("local-1", "local-2")
SERVER_START_TIMEOUT_S = 60.0
AGENTS_ONLINE_TIMEOUT_S = 60.0
# How long the quickstart waits for the agents' warm interpreters to import TensorFlow before it submits
# anyway (the job then starts cold, or waits in an interpreter still importing).
WARM_POOLS_TIMEOUT_S = 30.0
PORTS_PER_AGENT = 50
ADMIN_TOKEN_FILE = "admin-token"
MIN_TOKEN_LENGTH = 16  # what the coordinator accepts as MWMS_ADMIN_TOKEN


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def quickstart_admin_token(path: Path) -> str:
    """The admin token saved in `path` by an earlier run, else a new one written there (0600)."""
    try:
        saved = path.read_text().strip()
    except OSError:
        saved = ""
    if len(saved) >= MIN_TOKEN_LENGTH and not any(character.isspace() for character in saved):
        from mwms.private_files import make_private_file  # not at import: `mwms --help` stays light

        make_private_file(path)  # 0600; ForeignFileError when another user owns it
        return saved
    secret = new_secret()
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(secret + "\n")
    return secret


def agent_addresses(platform: str = sys.platform) -> tuple[str, ...]:
    """The address each agent advertises: its own loopback address on Linux, 127.0.0.1 for all elsewhere
    (macOS, for one, answers only 127.0.0.1 unless others are aliased by hand)."""
    if platform.startswith("linux"):
        return tuple(f"127.0.0.{number}" for number in range(1, len(AGENT_NAMES) + 1))
    return ("127.0.0.1",) * len(AGENT_NAMES)


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.25) -> bool:
    """True once `predicate()` is; False when `timeout_s` ran out first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return False


def warm_pools_of(agents: list[Agent]) -> list[dict[str, Any]]:
    """The warm pools (the API's `warm_pool` objects) of the agents that keep one."""
    pools = [agent.raw.get("warm_pool") or {} for agent in agents]
    return [pool for pool in pools if pool.get("size")]


class LocalCluster:
    """The coordinator and agents quickstart runs, with their log files under `data_dir/logs`."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.log_dir = data_dir / "logs"
        self.processes: list[ManagedProcess] = []
        self.http_port = 0
        self.grpc_port = 0
        self.admin_token_file = data_dir / ADMIN_TOKEN_FILE
        self.admin_token = quickstart_admin_token(self.admin_token_file)
        self.join_token = new_secret()  # lives as long as this coordinator process

    def client(self, timeout: float = 30.0) -> Client:
        """A client of the local coordinator with the admin token (the user's own settings do not apply)."""
        return Client.for_connection(Connection(api=self.api, token=self.admin_token), timeout=timeout)

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start_coordinator(self) -> None:
        """Starts the coordinator on ports it picks (port 0), learns them from its ports file, and waits
        for /healthz: no free port is picked here, so there is no race to lose."""
        ports_file = self.data_dir / "coordinator" / "ports.json"
        ports_file.unlink(missing_ok=True)
        argv = [
            *mwms_command(),
            "server",
            "--host",
            "127.0.0.1",
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--data-dir",
            str(self.data_dir / "coordinator"),
            "--ports-file",
            str(ports_file),
        ]
        secrets_env = {"MWMS_ADMIN_TOKEN": self.admin_token, "MWMS_JOIN_TOKEN": self.join_token}
        coordinator = start_process("coordinator", argv, self.log_dir / "coordinator.log", secrets_env)
        self.processes.append(coordinator)
        wait_until(lambda: ports_file.exists() or not coordinator.running(), SERVER_START_TIMEOUT_S)
        if not coordinator.running() or not ports_file.exists():
            raise CliError(self._failure("the coordinator did not start", coordinator), ExitCode.UNREACHABLE)
        ports = json.loads(ports_file.read_text())
        self.http_port, self.grpc_port = int(ports["http"]), int(ports["grpc"])
        if not self._wait_healthy(coordinator):
            raise CliError(
                self._failure("the coordinator did not become healthy", coordinator), ExitCode.UNREACHABLE
            )

    def _wait_healthy(self, coordinator: ManagedProcess) -> bool:
        """True once /healthz answers; False if the process exits or the time runs out first."""
        with self.client(timeout=2.0) as client:
            wait_until(lambda: client.health() or not coordinator.running(), SERVER_START_TIMEOUT_S)
            return coordinator.running() and client.health()

    def start_agents(self) -> None:
        """Starts one agent per name, each with its own work dir, address and port range, and waits until
        both are online."""
        base = 20000 + random.randrange(0, 400) * 100  # two quickstarts side by side rarely collide
        for number, (name, address) in enumerate(zip(AGENT_NAMES, agent_addresses(), strict=True)):
            low = base + number * PORTS_PER_AGENT
            argv = [
                *mwms_command(),
                "agent",
                "--server",
                f"127.0.0.1:{self.grpc_port}",
                "--name",
                name,
                "--work-dir",
                str(self.data_dir / "agents" / name),
                "--slots",
                "1",
                "--advertise-address",
                address,
                "--port-range",
                f"{low}-{low + PORTS_PER_AGENT - 1}",
            ]
            join_env = {"MWMS_JOIN_TOKEN": self.join_token}
            self.processes.append(start_process(name, argv, self.log_dir / f"{name}.log", join_env))
        with self.client() as client:

            def both_online() -> bool:
                self._check_running()
                online = {agent.name for agent in client.agents() if agent.online}
                return online.issuperset(AGENT_NAMES)

            if not wait_until(both_online, AGENTS_ONLINE_TIMEOUT_S, 0.5):
                raise CliError(
                    f"the agents did not come online within {AGENTS_ONLINE_TIMEOUT_S:.0f}s; "
                    f"see the logs in {self.log_dir}",
                    ExitCode.UNREACHABLE,
                )

    def keeps_warm_pools(self) -> bool:
        """Whether the agents keep warm interpreters (not with MWMS_AGENT_WARM_POOL=0)."""
        with self.client() as client:
            return bool(warm_pools_of(self._our_agents(client)))

    def wait_for_warm_pools(self, timeout_s: float = WARM_POOLS_TIMEOUT_S) -> bool:
        """Whether every agent that keeps a warm pool reported a ready interpreter (TensorFlow imported)
        within `timeout_s`; the agents report their pools with their heartbeats."""
        with self.client() as client:

            def all_ready() -> bool:
                self._check_running()
                pools = warm_pools_of(self._our_agents(client))
                return bool(pools) and all(pool.get("ready", 0) >= 1 for pool in pools)

            return wait_until(all_ready, timeout_s, 0.5)

    def task_isolation(self) -> str:
        """How the agents confine their tasks, as they registered it; said plainly when not at all."""
        with self.client() as client:
            labels = {agent.task_isolation or "unknown" for agent in client.agents()}
        text = "; ".join(sorted(labels))
        if "share" in text:
            text += (
                " (fine for your own jobs on this machine; run agents as root with bubblewrap for others')"
            )
        return text

    def _our_agents(self, client: Client) -> list[Agent]:
        return [agent for agent in client.agents() if agent.name in AGENT_NAMES and agent.online]

    def _check_running(self) -> None:
        """CliError (with its log's last lines) when one of the processes has exited."""
        for process in self.processes:
            if not process.running():
                raise CliError(self._failure(f"{process.name} exited", process), ExitCode.UNREACHABLE)

    def _failure(self, what: str, process: ManagedProcess) -> str:
        tail = "\n".join(f"  {line}" for line in last_lines(process.log_path, 20))
        code = process.popen.returncode
        exit_note = f" (exit code {code})" if code is not None else ""
        return f"{what}{exit_note}; its log is {process.log_path}" + (f":\n{tail}" if tail else "")

    def stop(self) -> None:
        stop_processes(self.processes)

"""A replicated coordinator for end-to-end tests: several `mwms server` processes on one PostgreSQL
database (testkit/mwms_testkit/postgres_server.py), each with its own data dir and ports, and agents given all of them.

Each replica is a testkit/mwms_testkit/cluster.py Cluster (ports file, health wait, REST client) that adds `--db-url`;
they share the admin and join tokens, so the REST API and the agents' credentials work on any of them.
Replicas start one after another: the first runs the migrations, the others find them done.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mwms_testkit.cluster import MWMS, NO_WARM_POOL, Cluster, Process, wait_until
from mwms_testkit.parallel import port_range


@dataclass
class Replica(Cluster):
    """One coordinator replica: the shared database instead of SQLite in its data dir."""

    db_url: str = ""

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def server_args(self) -> list[str]:
        return ["--db-url", self.db_url]

    def kill(self) -> None:
        """SIGKILL, as a crash would: no shutdown, the OS resets its connections."""
        assert self.server is not None
        self.server.popen.kill()
        self.server.popen.wait(10)


@dataclass
class ReplicaCluster:
    root: Path
    db_url: str
    replicas: list[Replica] = field(default_factory=list)
    agents: dict[str, Process] = field(default_factory=dict)
    admin_token: str = field(default_factory=lambda: "mwms_" + secrets.token_urlsafe(32))
    join_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    def start_replicas(self, count: int, server_env: dict[str, str] | None = None) -> list[Replica]:
        for number in range(len(self.replicas), len(self.replicas) + count):
            replica = Replica(
                root=self.root / f"replica-{number + 1}",
                db_url=self.db_url,
                admin_token=self.admin_token,
                join_token=self.join_token,
                server_env=dict(server_env or {}),
            )
            replica.root.mkdir(parents=True, exist_ok=True)
            replica.start_server()
            self.replicas.append(replica)
        return self.replicas

    def start_agent(self, name: str, servers: list[Replica], port_low: int) -> Process:
        """Starts `mwms agent --server A,B,...` (it is not waited for: the test says what it waits for)."""
        log_path = self.root / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("MWMS_") and k != "TF_CONFIG"}
        env.update(PYTHONUNBUFFERED="1", MWMS_JOIN_TOKEN=self.join_token, **NO_WARM_POOL)
        args = ["agent", "--server", ",".join(r.grpc_address for r in servers), "--name", name]
        args += ["--work-dir", str(self.root / name), "--advertise-address", "127.0.0.1"]
        args += ["--port-range", port_range(port_low)]
        with log_path.open("ab") as out:
            popen = subprocess.Popen(
                [MWMS, *args], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        agent = self.agents[name] = Process(name, popen, log_path)
        return agent

    def agent_row(self, replica: Replica, name: str) -> dict | None:
        """The agent as `replica`'s REST API shows it (None when it does not know the name)."""
        rows = replica.http.get("/api/v1/agents").json()
        return next((row for row in rows if row["name"] == name), None)

    def wait_online(self, replica: Replica, name: str, timeout: float = 30) -> dict:
        agent = self.agents[name]

        def online() -> dict | None:
            if agent.popen.poll() is not None:
                raise AssertionError(f"agent {name} exited:\n{agent.log_tail()}")
            row = self.agent_row(replica, name)
            return row if row and row["online"] else None

        return wait_until(online, timeout, f"agent {name} online", observed=agent.log_tail)

    def stop(self) -> None:
        for agent in self.agents.values():
            agent.stop()
        for replica in self.replicas:
            if replica.server is not None:
                replica.server.stop()


@contextmanager
def replicated(
    root: Path, db_url: str, count: int, server_env: dict[str, str] | None = None
) -> Iterator[ReplicaCluster]:
    """`count` replicas on `db_url`, stopped with their agents at the end."""
    cluster = ReplicaCluster(root=root, db_url=db_url)
    try:
        cluster.start_replicas(count, server_env=server_env)
        yield cluster
    finally:
        cluster.stop()

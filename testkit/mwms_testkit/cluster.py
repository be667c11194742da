"""A real local cluster for end-to-end tests: `mwms server` and `mwms agent` processes on loopback."""

from __future__ import annotations

import io
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from mwms_testkit.parallel import port_range

MWMS = str(Path(sys.executable).parent / "mwms")
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def free_port() -> int:
    """A port that was free a moment ago, for something that cannot bind port 0 and report it (a fake
    peer nothing listens on, a PostgreSQL server). Never for a coordinator: it binds port 0 (Cluster)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    interval: float = 0.2,
    observed: Callable[[], Any] | None = None,
) -> Any:
    """Polls `predicate` until it returns something truthy and returns that; after `timeout` seconds fails
    with the last value seen, or with what `observed()` says when given (the one polling helper of the tests)."""
    deadline = time.monotonic() + timeout
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() > deadline:
            seen = observed() if observed is not None else last
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; last observed: {seen!r}")
        time.sleep(interval)


def read_ports_file(path: Path) -> dict[str, int] | None:
    """The {"http": N, "grpc": M} a coordinator wrote to its --ports-file, None while it has not."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def pack(files: dict[str, str | bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def pack_dir(path: Path) -> bytes:
    return pack(
        {
            str(p.relative_to(path)): p.read_bytes()
            for p in path.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }
    )


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    log_path: Path

    def stop(self, grace: float = 10) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


# Agents the tests start keep no warm interpreters unless a test asks (--warm-pool N wins over it).
NO_WARM_POOL = {"MWMS_AGENT_WARM_POOL": "0"}


@dataclass
class Cluster:
    """`mwms server` and agents for one test module or session. The coordinator binds port 0 unless given
    ports and reports what it bound in a ports file; a restart binds the same ports again."""

    root: Path
    http_port: int = 0
    grpc_port: int = 0
    server: Process | None = None
    agents: dict[str, Process] = field(default_factory=dict)
    server_env: dict[str, str] = field(default_factory=dict)
    # The coordinator is started with these as MWMS_ADMIN_TOKEN and MWMS_JOIN_TOKEN.
    admin_token: str = field(default_factory=lambda: "mwms_" + secrets.token_urlsafe(32))
    join_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def http(self) -> httpx.Client:
        """A client that authenticates as the admin."""
        return self.client(self.admin_token)

    def client(self, token: str | None) -> httpx.Client:
        """A client with the given bearer token (none when None)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.api, timeout=30, headers=headers, trust_env=False)

    def server_environment(self) -> dict[str, str]:
        return {"MWMS_ADMIN_TOKEN": self.admin_token, "MWMS_JOIN_TOKEN": self.join_token, **self.server_env}

    def agent_environment(self) -> dict[str, str]:
        """The agents' environment: the join token, and no warm interpreters (each imports TensorFlow, a
        load the suite's tiny programs do not need; a test of the pool passes --warm-pool, which wins)."""
        return {"MWMS_JOIN_TOKEN": self.join_token, **NO_WARM_POOL}

    def create_token(self, user: str, role: str = "user") -> str:
        """A new API token for `user` with `role`, made by the admin."""
        response = self.http.post("/api/v1/tokens", json={"user": user, "role": role})
        assert response.status_code == 201, response.text
        return response.json()["token"]

    def _spawn(self, name: str, args: list[str], extra_env: dict[str, str] | None = None) -> Process:
        log_path = self.root / f"{name}.log"
        out = log_path.open("ab")
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra_env or {}))
        env.pop("TF_CONFIG", None)
        popen = subprocess.Popen(
            [MWMS, *args], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        return Process(name, popen, log_path)

    def server_args(self) -> list[str]:
        """`mwms server` flags besides ports, data dir and ports file; subclasses add theirs."""
        return []

    def spawn_server(self, args: list[str]) -> Process:
        """Starts the `mwms server` process with `args` (subclasses may start it another way)."""
        return self._spawn("server", args, self.server_environment())

    def start_server(self) -> None:
        """Starts the coordinator, learns the ports it bound from its ports file, waits for /healthz."""
        ports_file = self.root / "server-ports.json"
        ports_file.unlink(missing_ok=True)
        args = ["server", "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port)]
        args += ["--data-dir", str(self.root / "data"), "--ports-file", str(ports_file), *self.server_args()]
        server = self.server = self.spawn_server(args)

        def ports_written() -> dict[str, int] | None:
            if server.popen.poll() is not None:
                raise AssertionError(f"coordinator exited:\n{server.log_tail()}")
            return read_ports_file(ports_file)

        ports = wait_until(ports_written, 60, "the coordinator's ports file", observed=server.log_tail)
        self.http_port, self.grpc_port = ports["http"], ports["grpc"]
        wait_until(self._healthy, 60, f"coordinator health on {self.api}\n{server.log_tail()}")

    def _healthy(self) -> bool:
        assert self.server is not None
        if self.server.popen.poll() is not None:
            raise AssertionError(f"coordinator exited:\n{self.server.log_tail()}")
        try:
            return httpx.get(f"{self.api}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def start_agent(
        self, name: str, port_low: int, slots: int = 1, extra_args: Sequence[str] = ()
    ) -> Process:
        agent = self._spawn(
            name,
            [
                "agent",
                "--server",
                f"127.0.0.1:{self.grpc_port}",
                "--name",
                name,
                "--work-dir",
                str(self.root / name),
                "--slots",
                str(slots),
                "--advertise-address",
                "127.0.0.1",
                "--port-range",
                port_range(port_low),
                # One cache of jobs' own Python environments for the machine, as an operator would set it.
                "--env-cache-dir",
                str(self.root / "envs"),
                *extra_args,
            ],
            self.agent_environment(),
        )
        self.agents[name] = agent
        wait_until(lambda: self.agent_online(name), 60, f"agent {name} online\n{agent.log_tail()}")
        return agent

    def agent_online(self, name: str) -> bool:
        agents = self.http.get("/api/v1/agents").json()
        return any(a["name"] == name and a["online"] for a in agents)

    def restart_server(self) -> None:
        assert self.server is not None
        self.server.stop()
        self.start_server()  # on the ports it bound the first time: agents reconnect to the same address

    def stop(self) -> None:
        for agent in self.agents.values():
            agent.stop()
        if self.server is not None:
            self.server.stop()

    # --- jobs -------------------------------------------------------------------------------

    def upload(self, bundle: bytes) -> str:
        response = self.http.post("/api/v1/bundles", files={"file": ("bundle.tar.gz", bundle)})
        assert response.status_code in (200, 201), response.text
        return response.json()["digest"]

    def submit(
        self, files: dict[str, str | bytes] | bytes, command: list[str], workers: int = 2, **spec: Any
    ) -> str:
        digest = self.upload(files if isinstance(files, bytes) else pack(files))
        body = {"bundle_digest": digest, "command": command, "workers": workers, **spec}
        response = self.http.post("/api/v1/jobs", json=body)
        assert response.status_code == 201, response.text
        return response.json()["id"]

    def job(self, job_id: str) -> dict[str, Any]:
        return self.http.get(f"/api/v1/jobs/{job_id}").json()

    def wait_for(self, job_id: str, states: set[str], timeout: float = 120) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            job = self.job(job_id)
            return job if job["state"] in states else None

        try:
            return wait_until(reached, timeout, f"job {job_id} to reach {sorted(states)}")
        except AssertionError as error:
            job = self.job(job_id)
            raise AssertionError(
                f"{error}\njob: {job['state']} {job['reason']}\nlogs:\n{self.logs_text(job_id)}"
            ) from None

    def logs(self, job_id: str, task: int | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"tail": 10000}
        if task is not None:
            params["task"] = task
        return self.http.get(f"/api/v1/jobs/{job_id}/logs", params=params).json()["lines"]

    def logs_text(self, job_id: str, task: int | None = None) -> str:
        return "\n".join(f"[{x['task']}] {x['text']}" for x in self.logs(job_id, task))

    def metrics(self, job_id: str, **params: Any) -> list[dict[str, Any]]:
        return self.http.get(f"/api/v1/jobs/{job_id}/metrics", params=params).json()["points"]


def processes_of_job(job_id: str) -> list[int]:
    """Pids of live processes on this machine whose environment names the job (needs the same user or root)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and f"MWMS_JOB_ID={job_id}".encode() in environ.split(b"\0"):
            found.append(int(entry.name))
    return found

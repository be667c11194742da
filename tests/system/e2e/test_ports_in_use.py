"""A second `mwms server` on a port the first holds is refused within seconds, with one sentence naming
the port and the flag to change, and never says "ready" (issue 31: gRPC's default SO_REUSEPORT let
two coordinators share the agents' port, each agent reaching either at random). An agent given the
coordinator's HTTP port as --server says so and names the gRPC port, instead of gRPC's raw error."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from http.server import HTTPServer, SimpleHTTPRequestHandler
from pathlib import Path

import pytest

from mwms.worker_agent.wrong_server import http1_server_sentence
from mwms_testkit.cluster import MWMS, Cluster, Process, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    instance = Cluster(root=tmp_path_factory.mktemp("first-coordinator"))
    try:
        instance.start_server()
        yield instance
    finally:
        instance.stop()


def second_server(root: Path, http_port: int, grpc_port: int) -> subprocess.CompletedProcess[str]:
    """Runs a second coordinator with its own data dir on the given ports until it exits (30 s at most)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", MWMS_JOIN_TOKEN="j" * 32)
    args = ["server", "--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    args += ["--http-host", "127.0.0.1", "--grpc-host", "127.0.0.1", "--data-dir", str(root / "data")]
    return subprocess.run([MWMS, *args], capture_output=True, text=True, timeout=30, env=env)


def test_taken_grpc_port_refuses_the_start(first: Cluster, tmp_path: Path) -> None:
    done = second_server(tmp_path, 0, first.grpc_port)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert f"127.0.0.1:{first.grpc_port}" in output and "--grpc-port" in output, output
    assert "ready" not in output, output
    assert "Traceback" not in output, output


def test_taken_http_port_refuses_the_start(first: Cluster, tmp_path: Path) -> None:
    done = second_server(tmp_path, first.http_port, 0)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert f"127.0.0.1:{first.http_port}" in output and "--http-port" in output, output
    assert "ready" not in output, output
    assert "Traceback" not in output, output
    assert first.http.get("/healthz").status_code == 200  # the first one serves on


def test_agent_pointed_at_the_http_port_names_the_grpc_port(first: Cluster, tmp_path: Path) -> None:
    log_path = tmp_path / "agent.log"
    args = ["agent", "--server", f"127.0.0.1:{first.http_port}", "--name", "misdirected"]
    args += ["--work-dir", str(tmp_path / "work"), "--slots", "1", "--advertise-address", "127.0.0.1"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", **first.agent_environment())
    with log_path.open("ab") as out:
        popen = subprocess.Popen([MWMS, *args], stdout=out, stderr=subprocess.STDOUT, env=env)
    agent = Process("misdirected", popen, log_path)
    wanted = f"pass --server 127.0.0.1:{first.grpc_port}"
    try:
        wait_until(lambda: wanted in agent.log_tail(200), 60, wanted, observed=agent.log_tail)
        text = agent.log_tail(200)
        assert f"127.0.0.1:{first.http_port} is the coordinator's HTTP port" in text, text
        assert "http1.x" not in text, text
    finally:
        agent.stop()


def test_another_http_server_behind_server_names_the_default_grpc_port(tmp_path: Path) -> None:
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    other = HTTPServer(("127.0.0.1", 0), lambda *a: Quiet(*a, directory=str(tmp_path)))
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        address = f"127.0.0.1:{other.server_address[1]}"
        sentence = http1_server_sentence(address)
    finally:
        other.shutdown()
        other.server_close()
    assert sentence.startswith(f"{address} answers HTTP/1.x, not gRPC"), sentence
    assert "default 50051" in sentence and "--grpc-port" in sentence, sentence

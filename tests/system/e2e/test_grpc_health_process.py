"""grpc.health.v1 and reflection on a real `mwms server` process, as a prober, a load balancer or an operator
with grpcurl sees them: no credentials, reflection switched off by its flag, and a Watch that sees
NOT_SERVING when the process is told to stop (SIGTERM)."""

from __future__ import annotations

import json
import queue
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from mwms_testkit.cluster import Cluster

pytestmark = pytest.mark.e2e

AGENT_SERVICE = "mwms.v1.AgentService"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class NoReflectionCluster(Cluster):
    def server_args(self) -> list[str]:
        return ["--no-grpc-reflection"]


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    instance = Cluster(root=tmp_path_factory.mktemp("grpc-health"))
    try:
        instance.start_server()
        yield instance
    finally:
        instance.stop()


def test_health_and_reflection_answer_without_credentials(coordinator: Cluster) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{coordinator.grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", AGENT_SERVICE):
            assert health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status == SERVING
        assert AGENT_SERVICE in ProtoReflectionDescriptorDatabase(channel).get_services()
    healthz = httpx.get(f"{coordinator.api}/healthz", timeout=10)
    grpc_port = str(coordinator.grpc_port)
    assert healthz.json() == {"status": "ok", "grpc": "SERVING", "grpc_port": grpc_port}


@pytest.mark.skipif(shutil.which("grpcurl") is None, reason="grpcurl is not installed")
def test_grpcurl_checks_health_and_lists_services(coordinator: Cluster) -> None:
    address = f"127.0.0.1:{coordinator.grpc_port}"
    check = subprocess.run(
        ["grpcurl", "-plaintext", address, "grpc.health.v1.Health/Check"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout) == {"status": "SERVING"}
    listed = subprocess.run(
        ["grpcurl", "-plaintext", address, "list"], capture_output=True, text=True, timeout=30
    )
    assert listed.returncode == 0, listed.stderr
    assert {AGENT_SERVICE, "grpc.health.v1.Health"} <= set(listed.stdout.split())


def test_reflection_off_and_a_watch_through_the_stop(tmp_path: Path) -> None:
    instance = NoReflectionCluster(root=tmp_path)
    seen: queue.Queue[object] = queue.Queue()

    def watch(channel: grpc.Channel) -> None:
        stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=60)
        try:
            for answer in stream:
                seen.put(answer.status)
        except grpc.RpcError as error:  # the stream ends with the server
            seen.put(error.code())

    try:
        instance.start_server()
        assert instance.server is not None
        with grpc.insecure_channel(f"127.0.0.1:{instance.grpc_port}") as channel:
            reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            with pytest.raises(grpc.RpcError) as off:
                list(reflection.ServerReflectionInfo(iter([request]), timeout=10))
            assert off.value.code() == grpc.StatusCode.UNIMPLEMENTED

            watcher = threading.Thread(target=watch, args=(channel,), daemon=True)
            watcher.start()
            assert seen.get(timeout=10) == SERVING
            instance.server.popen.send_signal(signal.SIGTERM)
            assert seen.get(timeout=15) == NOT_SERVING, instance.server.log_tail()
            # uvicorn re-raises the signal once its shutdown is complete
            assert instance.server.popen.wait(30) in (0, -signal.SIGTERM), instance.server.log_tail()
            assert "Application shutdown complete" in instance.server.log_tail()
            watcher.join(timeout=10)
            assert not watcher.is_alive()
    finally:
        instance.stop()

"""grpc.health.v1 and server reflection on a real in-process coordinator (server/rpc/health.py): the standard
clients from grpcio-health-checking and grpcio-reflection over loopback, with no credentials, as a
Kubernetes probe or grpcurl calls them; and the agents' service still refusing callers without one."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from mwms.server.rpc.auth import PUBLIC_METHODS
from mwms.server.settings import Settings
from mwms.v1 import agent_pb2 as pb
from mwms_testkit.in_process_coordinator import InProcessCoordinator, coordinator_settings

AGENT_SERVICE = "mwms.v1.AgentService"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def start(stack: ExitStack, data_dir: Path, **values: object) -> tuple[InProcessCoordinator, grpc.Channel]:
    coordinator = InProcessCoordinator.start(stack, coordinator_settings(data_dir, **values))
    channel = stack.enter_context(grpc.insecure_channel(f"127.0.0.1:{coordinator.app.state.grpc_port}"))
    return coordinator, channel


@pytest.fixture(scope="module")
def coordinator(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[InProcessCoordinator, grpc.Channel]]:
    with ExitStack() as stack:
        yield start(stack, tmp_path_factory.mktemp("grpc-health"))


def test_health_answers_serving_without_credentials(coordinator) -> None:
    _, channel = coordinator
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", AGENT_SERVICE):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert answer.status == SERVING, service
    with pytest.raises(grpc.RpcError) as unknown:
        health.Check(health_pb2.HealthCheckRequest(service="mwms.v1.NoSuchService"), timeout=10)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_ignores_a_credential_it_does_not_need(coordinator) -> None:
    _, channel = coordinator
    answer = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(), metadata=(("authorization", "Bearer not-a-credential"),), timeout=10
    )
    assert answer.status == SERVING


def test_healthz_reports_the_grpc_state(coordinator) -> None:
    server, _ = coordinator
    response = server.http.get("/healthz")
    assert response.status_code == 200
    grpc_port = str(server.app.state.grpc_port)
    assert response.json() == {"status": "ok", "grpc": "SERVING", "grpc_port": grpc_port}


def test_reflection_lists_the_agent_service_and_health(coordinator) -> None:
    _, channel = coordinator
    database = ProtoReflectionDescriptorDatabase(channel)
    services = set(database.get_services())
    assert {AGENT_SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= services
    # The whole descriptor comes back, as grpcurl needs it to build requests.
    agent_service = DescriptorPool(database).FindServiceByName(AGENT_SERVICE)
    assert {"Register", "Connect", "FetchBundle", "UploadFiles", "FetchCheckpoint"} <= {
        method.name for method in agent_service.methods
    }


def test_the_agent_service_still_refuses_callers_without_a_credential(coordinator) -> None:
    server, _ = coordinator
    with pytest.raises(grpc.RpcError) as refused:
        list(server.stub.FetchBundle(pb.FetchBundleRequest(digest="0" * 64), timeout=10))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as refused:
        list(server.stub.Connect(iter([pb.AgentMessage()]), timeout=10))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # Of the agents' service only Register is public; the rest of the list is health and reflection.
    assert {path for path in PUBLIC_METHODS if path.startswith(f"/{AGENT_SERVICE}/")} == {
        f"/{AGENT_SERVICE}/Register"
    }
    assert all(
        path.startswith(("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/"))
        for path in PUBLIC_METHODS - {f"/{AGENT_SERVICE}/Register"}
    )


def test_reflection_off_answers_unimplemented_and_health_stays(tmp_path: Path) -> None:
    with ExitStack() as stack:
        _, channel = start(stack, tmp_path, grpc_reflection=False)
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        with pytest.raises(grpc.RpcError) as off:
            list(reflection.ServerReflectionInfo(iter([request]), timeout=10))
        assert off.value.code() == grpc.StatusCode.UNIMPLEMENTED
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert answer.status == SERVING


def test_reflection_setting_follows_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().grpc_reflection is True
    monkeypatch.setenv("MWMS_GRPC_REFLECTION", "false")
    assert Settings().grpc_reflection is False


def test_an_agents_only_replica_serves_health(tmp_path: Path) -> None:
    with ExitStack() as stack:
        server, channel = start(stack, tmp_path, serve="agents")
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert answer.status == SERVING
        grpc_port = str(server.app.state.grpc_port)
        assert server.http.get("/healthz").json() == {
            "status": "ok",
            "grpc": "SERVING",
            "grpc_port": grpc_port,
        }


def test_an_api_only_replica_has_no_grpc_to_report(tmp_path: Path) -> None:
    with ExitStack() as stack:
        server = InProcessCoordinator.start(stack, coordinator_settings(tmp_path, serve="api"))
        assert server.app.state.grpc_port == 0
        assert server.http.get("/healthz").json() == {"status": "ok"}


def test_a_watch_sees_not_serving_when_the_coordinator_stops(tmp_path: Path) -> None:
    seen: queue.Queue[object] = queue.Queue()

    def watch(channel: grpc.Channel) -> None:
        stream = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=AGENT_SERVICE), timeout=30
        )
        try:
            for answer in stream:
                seen.put(answer.status)
        except grpc.RpcError as error:  # the server ends the stream once its grace period is over
            seen.put(error.code())
        seen.put(None)

    with ExitStack() as outer:
        with ExitStack() as stack:
            server = InProcessCoordinator.start(stack, coordinator_settings(tmp_path))
            # A channel of its own that outlives the coordinator's stack, as a prober's does.
            channel = outer.enter_context(grpc.insecure_channel(f"127.0.0.1:{server.app.state.grpc_port}"))
            watcher = threading.Thread(target=watch, args=(channel,), daemon=True)
            watcher.start()
            assert seen.get(timeout=10) == SERVING
            # Closing the stack runs the app's shutdown: health says NOT_SERVING, then gRPC stops.
        assert seen.get(timeout=10) == NOT_SERVING
        watcher.join(timeout=10)
        assert not watcher.is_alive()


def test_health_over_tls_with_the_coordinators_ca(tmp_path: Path) -> None:
    with ExitStack() as stack:
        server = InProcessCoordinator.start(stack, coordinator_settings(tmp_path, tls_self_signed=True))
        credentials = grpc.ssl_channel_credentials((tmp_path / "tls" / "ca.pem").read_bytes())
        address = f"127.0.0.1:{server.app.state.grpc_port}"
        channel = stack.enter_context(grpc.secure_channel(address, credentials))
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert answer.status == SERVING
        assert AGENT_SERVICE in ProtoReflectionDescriptorDatabase(channel).get_services()

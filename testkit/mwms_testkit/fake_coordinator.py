"""A fake coordinator on a real gRPC server, for the agent's tests, and their fixtures (polling with a deadline,
the fake served, an agent started against it). Test folders that use them import the fixtures in their
conftest.py."""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from mwms.v1 import agent_pb2, agent_pb2_grpc
from mwms.worker_agent.config import AgentConfig
from mwms.worker_agent.credentials import CredentialInterceptor, CredentialStore
from mwms.worker_agent.main import run_agent
from mwms_testkit.cluster import wait_until

# What the fake coordinator issues at the first Register and expects on every later call.
FAKE_CREDENTIAL = "mwmsa_agent-1.fake-secret-for-tests"
TERMINAL = {
    agent_pb2.TASK_STATE_SUCCEEDED,
    agent_pb2.TASK_STATE_FAILED,
    agent_pb2.TASK_STATE_STOPPED,
    agent_pb2.TASK_STATE_REJECTED,
}


@pytest.fixture
def wait_for() -> Callable[..., Any]:
    """mwms_testkit.cluster's wait_until, with the agent tests' argument order and a 10 s default."""

    def wait_for_condition(
        check: Callable[[], Any], what: str, timeout: float = 10.0, observed: Callable[[], Any] | None = None
    ) -> Any:
        return wait_until(check, timeout, what, interval=0.02, observed=observed)

    return wait_for_condition


class FakeStream:
    """One Connect stream as the fake coordinator sees it."""

    def __init__(self, agent_id: str) -> None:
        self.agent_id = agent_id
        self.received: list[agent_pb2.AgentMessage] = []
        self.commands: queue.Queue[agent_pb2.CoordinatorMessage] = queue.Queue()
        self.closed = threading.Event()
        self.reader_done = threading.Event()

    def send(self, **body: Any) -> None:
        self.commands.put(agent_pb2.CoordinatorMessage(**body))

    def close(self) -> None:
        """Ends the stream from the coordinator's side (as a coordinator restart would)."""
        self.closed.set()

    def of_kind(self, kind: str) -> list[Any]:
        return [getattr(m, kind) for m in list(self.received) if m.WhichOneof("body") == kind]


class FakeCoordinator(agent_pb2_grpc.AgentServiceServicer):
    """The coordinator's side of the protocol, just enough to drive an agent; records what it sees."""

    def __init__(self) -> None:
        self.registrations: list[tuple[agent_pb2.RegisterRequest, Any]] = []
        self.streams: list[FakeStream] = []
        self.bundles: dict[str, bytes] = {}
        self.bundle_fetches: list[str] = []
        # Cleared by a test to hold FetchBundle (and so keep a task STARTING).
        self.bundles_released = threading.Event()
        self.bundles_released.set()
        self.uploads: list[tuple[str, int, bytes]] = []
        # Checkpoint archives by job id (FetchCheckpoint streams nothing for a job without one).
        self.checkpoints: dict[str, bytes] = {}
        self.checkpoint_fetches: list[str] = []
        self.checkpoint_fetch_error: grpc.StatusCode | None = None
        self.refuse_with: grpc.StatusCode | None = None
        # When set, a Register that presents a credential is refused as a removed agent's would be.
        self.refuse_credentials = False
        # When set, log/metric batches and final reports are acknowledged as they arrive.
        self.auto_ack = True
        self.heartbeat_interval_ms = 200
        # When set, every heartbeat is answered with an Ack without a task id (the agent then expects it).
        self.answer_heartbeats = False
        # When set, open streams stay open but nothing at all is sent on them (a hung coordinator).
        self.silent = False
        self.server: grpc.Server | None = None
        # Uploads and task reports in the order they arrived, to check artifacts come before the end.
        self.timeline: list[tuple[str, str, int]] = []
        # RPCs (other than Register) that came without the credential; the fixture fails the test on any.
        self.calls_without_credential: list[str] = []

    def _check_credential(self, method: str, context: grpc.ServicerContext) -> str:
        """The agent id the call's credential proves ("" and recorded when it carries none)."""
        metadata = dict(context.invocation_metadata())
        if metadata.get("authorization") == f"Bearer {FAKE_CREDENTIAL}":
            return "agent-1"
        self.calls_without_credential.append(method)
        return ""

    # --- the RPCs -------------------------------------------------------------------------------
    def Register(self, request: agent_pb2.RegisterRequest, context: grpc.ServicerContext) -> Any:
        self.registrations.append((request, context.invocation_metadata()))
        if self.refuse_with is not None:
            context.abort(self.refuse_with, "join token does not match; ask the operator for the current one")
        if self.refuse_credentials and "authorization" in dict(context.invocation_metadata()):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "the credential of agent 'a' is no longer valid")
        known = dict(context.invocation_metadata()).get("authorization") == f"Bearer {FAKE_CREDENTIAL}"
        return agent_pb2.RegisterResponse(
            agent_id="agent-1",
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            credential="" if known else FAKE_CREDENTIAL,
        )

    def Connect(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        stream = FakeStream(self._check_credential("Connect", context))
        self.streams.append(stream)
        threading.Thread(target=self._read, args=(stream, request_iterator), daemon=True).start()
        while context.is_active() and not stream.closed.is_set():
            if stream.reader_done.is_set() and stream.commands.empty():
                return  # the agent half-closed (it said goodbye): the call ends, as the coordinator ends it
            if self.silent:
                time.sleep(0.02)
                continue
            try:
                yield stream.commands.get(timeout=0.02)
            except queue.Empty:
                continue

    def FetchBundle(
        self, request: agent_pb2.FetchBundleRequest, context: grpc.ServicerContext
    ) -> Iterator[Any]:
        self._check_credential("FetchBundle", context)
        self.bundle_fetches.append(request.digest)
        self.bundles_released.wait(10)
        data = self.bundles.get(request.digest)
        if data is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no bundle {request.digest}")
        for offset in range(0, len(data), 1000):
            yield agent_pb2.BundleChunk(data=data[offset : offset + 1000])

    def FetchCheckpoint(
        self, request: agent_pb2.FetchCheckpointRequest, context: grpc.ServicerContext
    ) -> Iterator[Any]:
        self._check_credential("FetchCheckpoint", context)
        self.checkpoint_fetches.append(request.job_id)
        if self.checkpoint_fetch_error is not None:
            context.abort(self.checkpoint_fetch_error, "the checkpoint store is not reachable")
        data = self.checkpoints.get(request.job_id, b"")
        for offset in range(0, len(data), 1000):
            yield agent_pb2.BundleChunk(data=data[offset : offset + 1000])

    def UploadFiles(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
        self._check_credential("UploadFiles", context)
        chunks = list(request_iterator)
        data = b"".join(chunk.data for chunk in chunks)
        self.uploads.append((chunks[0].task_id, chunks[0].kind, data))
        self.timeline.append(("upload", chunks[0].task_id, chunks[0].kind))
        return agent_pb2.UploadFilesResponse(size=len(data), sha256=hashlib.sha256(data).hexdigest())

    # --- helpers for tests ------------------------------------------------------------------------
    def add_bundle(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        self.bundles[digest] = data
        return digest

    def latest_stream(self) -> FakeStream | None:
        return self.streams[-1] if self.streams else None

    def reports(self, task_id: str) -> list[agent_pb2.TaskReport]:
        """Every report for `task_id` on any stream (Hello entries included), in arrival order."""
        found = []
        for stream in list(self.streams):
            for message in list(stream.received):
                kind = message.WhichOneof("body")
                if kind == "task" and message.task.task_id == task_id:
                    found.append(message.task)
                elif kind == "hello":
                    found.extend(t for t in message.hello.tasks if t.task_id == task_id)
        return found

    def states(self, task_id: str) -> list[int]:
        return [report.state for report in self.reports(task_id)]

    def log_lines(self, task_id: str, stream: FakeStream | None = None) -> list[agent_pb2.LogLine]:
        streams = [stream] if stream else list(self.streams)
        return [
            line
            for s in streams
            for batch in s.of_kind("logs")
            if batch.task_id == task_id
            for line in batch.lines
        ]

    def _read(self, stream: FakeStream, request_iterator: Iterator[agent_pb2.AgentMessage]) -> None:
        try:
            for message in request_iterator:
                stream.received.append(message)
                if message.WhichOneof("body") == "task":
                    self.timeline.append(("report", message.task.task_id, message.task.state))
                if message.WhichOneof("body") == "heartbeat" and self.answer_heartbeats:
                    stream.send(ack=agent_pb2.Ack())
                if self.auto_ack:
                    self._acknowledge(stream, message)
        except grpc.RpcError:
            pass
        finally:
            stream.reader_done.set()

    def _acknowledge(self, stream: FakeStream, message: agent_pb2.AgentMessage) -> None:
        kind = message.WhichOneof("body")
        if kind == "logs":
            stream.send(ack=agent_pb2.Ack(task_id=message.logs.task_id, log_seq=message.logs.lines[-1].seq))
        elif kind == "metrics":
            batch = message.metrics
            stream.send(ack=agent_pb2.Ack(task_id=batch.task_id, metric_seq=batch.points[-1].seq))
        elif kind == "task" and message.task.state in TERMINAL:
            stream.send(ack=agent_pb2.Ack(task_id=message.task.task_id, final_state=True))


@pytest.fixture
def serve_coordinator() -> Iterator[Callable[..., tuple[FakeCoordinator, str]]]:
    """Starts fake coordinators on real gRPC servers (port 0: a free one); all are stopped at teardown."""
    servers: list[tuple[FakeCoordinator, grpc.Server]] = []

    def serve(port: int = 0, tls: tuple[bytes, bytes] | None = None) -> tuple[FakeCoordinator, str]:
        """`tls`: (private key, certificate chain) in PEM to serve TLS with; clear text when None."""
        fake = FakeCoordinator()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        agent_pb2_grpc.add_AgentServiceServicer_to_server(fake, server)
        if tls is None:
            bound = server.add_insecure_port(f"127.0.0.1:{port}")
        else:
            bound = server.add_secure_port(f"127.0.0.1:{port}", grpc.ssl_server_credentials([tls]))
        server.start()
        fake.server = server
        servers.append((fake, server))
        return fake, f"127.0.0.1:{bound}"

    yield serve
    for fake, server in servers:
        for stream in fake.streams:
            stream.close()
        server.stop(grace=None)
    for fake, _ in servers:
        assert not fake.calls_without_credential, (
            f"calls without the agent credential: {fake.calls_without_credential}"
        )


@pytest.fixture
def agent_channel(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], grpc.Channel]:
    """Opens a channel to `address` that presents the fake coordinator's credential, as an agent's does."""

    def open_channel(address: str) -> grpc.Channel:
        store = CredentialStore(tmp_path_factory.mktemp("credential"))
        store.save(FAKE_CREDENTIAL)
        return grpc.intercept_channel(grpc.insecure_channel(address), CredentialInterceptor(store))

    return open_channel


@pytest.fixture
def coordinator(serve_coordinator: Callable[..., tuple[FakeCoordinator, str]]) -> tuple[FakeCoordinator, str]:
    """A fake coordinator on a real gRPC server on a free loopback port, and its address."""
    return serve_coordinator()


class RunningAgent:
    """`run_agent` in a thread, with its stop event and (once it returns) its exit code."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.stop = threading.Event()
        self.exit_code: int | None = None
        self.thread = threading.Thread(target=self._run, name="agent-under-test", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.exit_code = run_agent(self.config, self.stop)

    def shut_down(self, timeout: float = 20.0) -> int | None:
        self.stop.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "run_agent did not return after stop was set"
        return self.exit_code


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator[Callable[..., RunningAgent]]:
    """Starts `run_agent` against an address; every agent started is stopped at teardown."""
    agents: list[RunningAgent] = []

    def start(server: str, **overrides: Any) -> RunningAgent:
        fields: dict[str, Any] = dict(
            server=server,
            name="test-agent",
            work_dir=tmp_path / "agent",
            slots=2,
            stop_grace=2.0,
            warm_pool=0,
        )
        fields.update(overrides)
        agent = RunningAgent(AgentConfig(**fields))
        agents.append(agent)
        return agent

    yield start
    for agent in agents:
        if agent.thread.is_alive():
            agent.shut_down()

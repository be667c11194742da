"""A link that dies without breaking: gRPC keepalive notices a network that stopped forwarding, and a
coordinator that answers heartbeats and then falls silent is left for a new connection. Tasks keep running."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from mwms.v1 import agent_pb2
from mwms.worker_agent import connection, main
from mwms_testkit.agent_builders import start_task
from mwms_testkit.cluster import pack

S = agent_pb2

WAIT_FOR_GO = (
    "import os, time\n"
    "print('up', flush=True)\n"
    "go = os.path.join(os.environ['MWMS_OUTPUT_DIR'], '..', 'go')\n"
    "while not os.path.exists(go):\n"
    "    time.sleep(0.02)\n"
)


def start_waiting_task(fake, stream, task_id: str) -> None:  # type: ignore[no-untyped-def]
    digest = fake.add_bundle(pack({"train.py": WAIT_FOR_GO}))
    stream.send(start=start_task(task_id, digest, task_index=1, stop_grace_seconds=0))


class FreezingProxy:
    """A TCP proxy on loopback; `freeze()` makes existing connections stop forwarding in both directions
    without closing them (a dropped network), while new connections are forwarded normally."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self._upstream = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._frozen: list[threading.Event] = []
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        for frozen in self._frozen:
            frozen.set()

    def close(self) -> None:
        self._listener.close()
        for sock in self._sockets:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._upstream)
            frozen = threading.Event()
            self._frozen.append(frozen)
            self._sockets += [client, server]
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, target, frozen), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket, frozen: threading.Event) -> None:
        try:
            while data := source.recv(65536):
                if frozen.is_set():
                    return  # swallow this and everything after; keep both sockets open
                target.sendall(data)
        except OSError:
            pass


@pytest.fixture
def proxy() -> Iterator[list[FreezingProxy]]:
    proxies: list[FreezingProxy] = []
    yield proxies
    for item in proxies:
        item.close()


def test_keepalive_options_are_set_on_the_channel() -> None:
    options = dict(main.CHANNEL_OPTIONS)
    assert options["grpc.keepalive_time_ms"] == 10_000 and options["grpc.keepalive_timeout_ms"] == 5_000
    assert options["grpc.keepalive_permit_without_calls"] == 1
    assert options["grpc.http2.max_pings_without_data"] == 0


def test_a_network_that_stops_forwarding_is_noticed_and_the_agent_reconnects(
    coordinator, start_agent, wait_for, monkeypatch, proxy
) -> None:  # type: ignore[no-untyped-def]
    # gRPC 1.85 resets its keepalive timer on every write, and the agent writes a heartbeat every interval,
    # so keepalive pings are not what notices this; the silence watchdog is (limit 3 x 0.2 s + 0.5 s).
    monkeypatch.setattr(connection, "SILENCE_GRACE_SECONDS", 0.5)
    fake, address = coordinator
    fake.answer_heartbeats = True
    proxy.append(FreezingProxy(address))
    start_agent(proxy[0].address)
    wait_for(lambda: fake.streams and fake.streams[0].of_kind("hello"), "the first session")
    start_waiting_task(fake, fake.streams[0], "task-1")
    wait_for(lambda: fake.log_lines("task-1"), "the task's first line")
    pid = fake.reports("task-1")[-1].pid

    frozen_at = time.monotonic()
    proxy[0].freeze()
    wait_for(
        lambda: len(fake.streams) >= 2 and fake.streams[1].of_kind("hello"),
        "a new session after the link went dead",
    )
    assert time.monotonic() - frozen_at < 5
    hello = fake.streams[1].of_kind("hello")[0]
    assert [(t.task_id, t.state, t.pid) for t in hello.tasks] == [("task-1", S.TASK_STATE_RUNNING, pid)]


def test_a_coordinator_that_answered_heartbeats_and_falls_silent_is_left(
    coordinator, start_agent, wait_for, monkeypatch, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(connection, "SILENCE_GRACE_SECONDS", 0.5)  # limit: 3 x 0.2 s + 0.5 s
    fake, address = coordinator
    start_agent(address)
    wait_for(lambda: fake.streams and fake.streams[0].of_kind("hello"), "the first session")
    start_waiting_task(fake, fake.streams[0], "task-1")
    wait_for(lambda: fake.log_lines("task-1"), "the task's first line")
    pid = fake.reports("task-1")[-1].pid

    # A coordinator that never answers heartbeats is not held to it (an older coordinator).
    fake.silent = True
    time.sleep(2.0)
    assert len(fake.streams) == 1
    fake.silent = False

    fake.answer_heartbeats = True
    wait_for(lambda: len(fake.streams[0].of_kind("heartbeat")) >= 3, "answered heartbeats")
    time.sleep(0.3)
    fake.silent = True  # the stream stays open, nothing more arrives on it, nor on the next one
    wait_for(lambda: len(fake.streams) >= 3, "two reconnects while the coordinator is silent", timeout=10)
    fake.silent = False
    settled = len(fake.streams)
    wait_for(lambda: len(fake.streams[-1].of_kind("heartbeat")) >= 10, "a healthy session")
    assert len(fake.streams) == settled

    # The task ran through all of it: one process, reported RUNNING in every Hello.
    for stream in fake.streams[1:]:
        hello = stream.of_kind("hello")[0]
        assert [(t.task_id, t.state, t.pid) for t in hello.tasks] == [("task-1", S.TASK_STATE_RUNNING, pid)]
    (tmp_path / "agent/jobs/job-1/attempt-1/task-1/go").touch()
    wait_for(lambda: S.TASK_STATE_SUCCEEDED in fake.states("task-1"), "SUCCEEDED")

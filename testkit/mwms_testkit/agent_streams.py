"""A coordinator in the test process driven the way agents drive it: over real Connect streams
(`Coordinator.join` registers an agent and opens its stream; `Stream.send`/`next`), with a running job's
rows written straight into its database. Tests of what crosses the agents' streams share it."""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from mwms.server.db.models import Task
from mwms.v1 import agent_pb2 as pb
from mwms.v1 import agent_pb2_grpc
from mwms_testkit.coordinator_rows import place_task, register_request
from mwms_testkit.in_process_coordinator import InProcessCoordinator, coordinator_settings

JOIN_TOKEN = "join-token-for-poison-tests-0123456789abc"
ADMIN_TOKEN = "mwms_admin-token-for-poison-tests-012345"
NOW_MS = 1764500000000


class Stream:
    """A Connect stream driven by the test: `send` queues agent messages, `next` reads coordinator messages."""

    def __init__(self, stub: agent_pb2_grpc.AgentServiceStub, credential: str) -> None:
        self._out: queue.Queue[pb.AgentMessage | None] = queue.Queue()
        self._in: queue.Queue[pb.CoordinatorMessage | BaseException] = queue.Queue()
        self.call = stub.Connect(
            iter(self._out.get, None), metadata=(("authorization", f"Bearer {credential}"),)
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for message in self.call:
                self._in.put(message)
        except grpc.RpcError as error:
            self._in.put(error)

    def send(self, **body: Any) -> None:
        self._out.put(pb.AgentMessage(**body))

    def next(self, kind: str, timeout: float = 10, where: Callable[[Any], bool] = lambda _: True) -> Any:
        """The next coordinator message of `kind` (start, stop, ack) matching `where`; others are skipped."""
        deadline = time.monotonic() + timeout
        while True:
            item = self._in.get(timeout=max(0.01, deadline - time.monotonic()))
            if isinstance(item, BaseException):
                raise AssertionError(f"the stream ended: {item}")
            body = getattr(item, kind) if item.WhichOneof("body") == kind else None
            if body is not None and where(body):
                return body

    def acked(self, task_id: str, log_seq: int = 0, metric_seq: int = 0, timeout: float = 10) -> list[Any]:
        """Waits until the task's log lines up to `log_seq` and points up to `metric_seq` are acknowledged
        (one Ack may acknowledge both: the batches of one transaction); the task's acks read meanwhile."""
        acks: list[Any] = []

        def covers(ack: Any) -> bool:
            if ack.task_id != task_id:
                return False
            acks.append(ack)
            return max(a.log_seq for a in acks) >= log_seq and max(a.metric_seq for a in acks) >= metric_seq

        self.next("ack", timeout=timeout, where=covers)
        return acks

    def close(self) -> None:
        self._out.put(None)
        self.call.cancel()


@dataclass
class Coordinator(InProcessCoordinator):
    @classmethod
    def for_streams(cls, stack: ExitStack, data_dir: Path) -> Coordinator:
        """A coordinator with a join token, an admin token and agents never lost in a test's time."""
        settings = coordinator_settings(
            data_dir, join_token=JOIN_TOKEN, admin_token=ADMIN_TOKEN, agent_timeout_s=300
        )
        return cls.start(stack, settings, admin_token=ADMIN_TOKEN)

    def join(self, name: str) -> tuple[str, Stream]:
        response = self.stub.Register(register_request(name, JOIN_TOKEN, port_low=21000), timeout=10)
        stream = Stream(self.stub, response.credential)
        return response.agent_id, stream

    def running_job(
        self, agent_id: str, options: dict[str, Any] | None = None, state: str = "RUNNING"
    ) -> Task:
        """A job with one task on `agent_id` (rows written directly)."""
        return place_task(
            self.db,
            agent_id,
            digest=hashlib.sha256(b"poison").hexdigest(),
            state=state,
            job_state="RUNNING" if state == "RUNNING" else "SCHEDULED",
            options=options,
            port=21000,
        )

    def job(self, job_id: str) -> dict[str, Any]:
        response = self.http.get(f"/api/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        return response.json()


def point(seq: int, step: int, value: float, name: str = "loss", unix_ms: int = NOW_MS) -> pb.MetricPoint:
    return pb.MetricPoint(seq=seq, name=name, step=step, value=value, unix_ms=unix_ms)


def hello(stream: Stream, agent_id: str, *tasks: Task) -> None:
    reports = [pb.TaskReport(task_id=t.id, state=pb.TASK_STATE_RUNNING, pid=4242) for t in tasks]
    stream.send(hello=pb.Hello(agent_id=agent_id, tasks=reports))

"""One Connect stream with the coordinator: Hello, then heartbeats, task reports, logs and metrics up;
start/stop commands and acks down. While the agent is still stopping what a previous agent process left
running, the stream carries heartbeats only, and the Hello follows once those tasks have ended.

The connection never blocks on its tasks: commands go to the TaskManager, which does its work in threads.
When the stream breaks the connection ends; the agent's main loop registers again and opens a new one, whose
Hello carries every known task and which resends everything not yet acknowledged.

A stream can also die without breaking (a coordinator that hangs, a middlebox that keeps the TCP
connection but forwards nothing). A coordinator that answers heartbeats (an Ack without a task id) is
expected to keep doing so: once one answer has been seen, 3 heartbeat intervals + 5 s without any message
end the connection, and the agent reconnects. A coordinator that never answers heartbeats is not held to it;
gRPC keepalive pings still notice a dead network under it.

On a clean stop (`close(goodbye=...)`, after the tasks' final reports) the last message is a Goodbye and the
agent half-closes the stream; the coordinator stores it (the agent then reads as stopped, not lost) and
ends the call. A coordinator that does not within GOODBYE_WAIT_SECONDS has its call cancelled.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Generator, Iterator

import grpc

from mwms.v1 import agent_pb2, agent_pb2_grpc
from mwms.worker_agent.device_telemetry import DeviceTelemetry
from mwms.worker_agent.stacks import answer_dump_stacks, dump_targets, preferred_method
from mwms.worker_agent.tasks import TaskManager

log = logging.getLogger("mwms.agent.connection")

# What a task printed or reported reaches the coordinator within this (a full batch goes at once). Each batch is
# a message and an Ack, the coordinator's costliest after heartbeats: at 0.2 s a task streaming logs and metrics
# sent half-full batches, and the bench's "both" case took a fifth more CPU per item than at 0.5 s (bench/README.md,
# Ingest). Other agents wait longer still (OpenTelemetry's log processor and fluent-bit flush every second).
BATCH_INTERVAL_SECONDS = 0.5
BATCH_MAX_ITEMS = 500
# And at most this much of a task's output in one batch, as spooled (worker_agent/outbox.py: not less than on the wire):
# the coordinator refuses a message past 16 MiB by ending the whole stream, and 500 lines of 64 KiB (a program
# printing without newlines, cut by worker_agent/output_lines.py) were 32 MiB. The agent resent the batch on
# every reconnect, so neither that task's output nor any later report of the agent's tasks got through.
BATCH_MAX_BYTES = 4 * 1024 * 1024
# Batches sent between two looks at the heartbeat clock, so a backlog never delays a heartbeat long.
MAX_BATCHES_PER_PASS = 20
# Silence allowed on a stream beyond 3 heartbeat intervals before it is treated as dead.
SILENCE_GRACE_SECONDS = 5.0
# While a recovery holds the Hello back, how often the sender looks whether the stream is closing.
RECOVERY_POLL_SECONDS = 0.1
# On a clean stop, how long to wait for the coordinator to store the Goodbye and end the call.
GOODBYE_WAIT_SECONDS = 2.0


class AgentConnection:
    """The agent side of one Connect stream."""

    def __init__(
        self,
        stub: agent_pb2_grpc.AgentServiceStub,
        agent_id: str,
        heartbeat_interval: float,
        tasks: TaskManager,
        heartbeats_answered: threading.Event | None = None,
        devices: DeviceTelemetry | None = None,
    ) -> None:
        self._stub = stub
        self._agent_id = agent_id
        self._heartbeat_interval = heartbeat_interval
        self._tasks = tasks
        # Shared by the agent's connections: set once the coordinator has answered a heartbeat.
        self._heartbeats_answered = heartbeats_answered or threading.Event()
        self._silence_limit = 3 * heartbeat_interval + SILENCE_GRACE_SECONDS
        self._last_received = time.monotonic()
        self._call: grpc.Future | None = None
        self._closing = threading.Event()
        # The last message to send once closing, on a clean stop only (set by `close` before `_closing`).
        self._goodbye: agent_pb2.Goodbye | None = None
        # Set once the stream has ended, whatever the cause.
        self.ended = threading.Event()
        # The highest seq sent on this stream, per task; a new connection starts from the last ack.
        self._sent_log_seq: dict[str, int] = {}
        self._sent_metric_seq: dict[str, int] = {}
        # Answers prepared off the stream thread (stack dumps), sent by the sender with the reports.
        self._answers: queue.Queue[agent_pb2.AgentMessage] = queue.Queue()
        self._stack_method = preferred_method()
        # The heartbeat awaiting its answer (monotonic send time) and the last measured round trip, sent
        # with the next heartbeat for the coordinator's mwms_heartbeat_round_trip_seconds.
        self._heartbeat_sent_at: float | None = None
        self._last_round_trip_ms = 0
        # Device telemetry is best effort: the newest reading goes up while connected, none is kept.
        self._devices = devices

    def open(self) -> None:
        """Opens the stream and starts reading commands in a background thread."""
        call = self._stub.Connect(self._outgoing())  # the channel presents the agent's credential
        self._call = call
        threading.Thread(target=self._read_commands, args=(call,), name="stream-reader", daemon=True).start()

    def close(self, goodbye: str | None = None) -> None:
        """Ends the stream. With `goodbye` (a clean stop), a Goodbye with that reason goes last and the
        coordinator gets GOODBYE_WAIT_SECONDS to store it and end the call; otherwise, or after that, the
        call is cancelled."""
        if goodbye is not None and self._call is not None and not self._closing.is_set():
            self._goodbye = agent_pb2.Goodbye(reason=goodbye)
        self._closing.set()
        self._tasks.reports_ready.set()
        if self._goodbye is not None and self.ended.wait(GOODBYE_WAIT_SECONDS):
            log.info("said goodbye to the coordinator")
        if self._call is not None:
            self._call.cancel()
        self.ended.wait(5.0)

    def _read_commands(self, call: Iterator[agent_pb2.CoordinatorMessage]) -> None:
        try:
            for message in call:
                self._last_received = time.monotonic()
                self._dispatch(message)
        except grpc.RpcError as error:
            if not self._closing.is_set():
                code = error.code() if isinstance(error, grpc.Call) else None
                if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    details = error.details() if isinstance(error, grpc.Call) else ""
                    log.error("the coordinator ended the connection: %s: %s", code.name, details)
                else:
                    log.warning("connection to the coordinator lost (%s)", code.name if code else error)
        except Exception:  # noqa: BLE001 - a bad command must end this connection, not the agent
            log.exception("the connection failed while handling a command")
        else:
            if not self._closing.is_set():
                log.warning("the coordinator closed the connection")
        finally:
            self._closing.set()
            self._tasks.reports_ready.set()
            if self._call is not None:
                self._call.cancel()
            self.ended.set()

    def _dispatch(self, message: agent_pb2.CoordinatorMessage) -> None:
        kind = message.WhichOneof("body")
        if kind == "start":
            self._tasks.start(message.start)
        elif kind == "stop":
            self._tasks.stop(message.stop)
        elif kind == "dump_stacks":
            request = message.dump_stacks
            targets = dump_targets(request.task_ids, self._tasks.records())
            answer_dump_stacks(request, targets, self._queue_answer, self._stack_method)
        elif kind == "ack":
            if not message.ack.task_id:
                self._heartbeats_answered.set()
                self._heartbeat_answered()
                return
            self._tasks.ack(message.ack)
        else:
            log.warning("ignoring a coordinator message of unknown kind %r", kind)

    def _heartbeat_answered(self) -> None:
        sent_at, self._heartbeat_sent_at = self._heartbeat_sent_at, None
        if sent_at is not None:
            # At least 1 ms: 0 means "not measured yet" on the wire.
            self._last_round_trip_ms = min(2**31 - 1, max(1, round((time.monotonic() - sent_at) * 1000)))

    def _outgoing(self) -> Iterator[agent_pb2.AgentMessage]:
        next_heartbeat = time.monotonic()
        self._last_received = time.monotonic()
        # While the tasks of a previous agent process are being stopped (up to the stop grace), the
        # stream only beats: the agent is alive, and the Hello that lets commands flow says how they ended.
        while not self._tasks.recovered.is_set():
            if self._closing.is_set():
                return
            if time.monotonic() >= next_heartbeat:
                yield self._heartbeat()
                next_heartbeat = time.monotonic() + self._heartbeat_interval
            self._tasks.recovered.wait(
                min(RECOVERY_POLL_SECONDS, max(0.0, next_heartbeat - time.monotonic()))
            )
        # Reports queued before this Hello are covered by it: it carries every task's latest state.
        self._drain_reports()
        hello_reports, deferred = self._tasks.hello_reports()
        yield agent_pb2.AgentMessage(hello=agent_pb2.Hello(agent_id=self._agent_id, tasks=hello_reports))
        while not self._closing.is_set():
            # Cleared before looking, so a report queued from here on wakes the wait below.
            self._tasks.reports_ready.clear()
            now = time.monotonic()
            if now >= next_heartbeat:
                yield self._heartbeat()
                next_heartbeat = now + self._heartbeat_interval
            reading = self._devices.take() if self._devices is not None else None
            if reading is not None:
                yield agent_pb2.AgentMessage(devices=reading)
            # Reports are taken before the logs and metrics and sent after them: a task queues its final
            # report after its last lines, so the report never overtakes them.
            reports, deferred = deferred + self._drain_reports(), []
            preflight_results = self._tasks.drain_preflight_results()
            backlog = yield from self._unsent_batches(MAX_BATCHES_PER_PASS)
            for result in preflight_results:  # before the FAILED report a failed check leads to
                yield agent_pb2.AgentMessage(preflight=result)
            for report in reports:
                yield agent_pb2.AgentMessage(task=report)
            while not self._answers.empty():
                yield self._answers.get_nowait()
            if backlog:
                continue  # more to send, with a heartbeat in between when one is due
            wait = min(BATCH_INTERVAL_SECONDS, max(0.0, next_heartbeat - time.monotonic()))
            self._tasks.reports_ready.wait(wait)
        if self._goodbye is not None:
            # After every report sent above; ending the iterator then half-closes the stream.
            yield agent_pb2.AgentMessage(goodbye=self._goodbye)

    def _heartbeat(self) -> agent_pb2.AgentMessage:
        heartbeat = agent_pb2.Heartbeat(
            sent_unix_ms=int(time.time() * 1000), last_round_trip_ms=self._last_round_trip_ms
        )
        pool = getattr(self._tasks, "warm_pool", None)
        if pool is not None:  # what the agent list shows of it (`mwms agents`)
            heartbeat.warm_pool_ready = pool.ready_count()
            heartbeat.warm_pool_bytes = pool.memory_bytes()
        self._heartbeat_sent_at = time.monotonic()
        return agent_pb2.AgentMessage(heartbeat=heartbeat)

    def _queue_answer(self, message: agent_pb2.AgentMessage) -> None:
        self._answers.put(message)
        self._tasks.reports_ready.set()

    def end_if_silent(self) -> bool:
        """Ends the stream when the coordinator, which answers heartbeats, has been silent too long.

        Called from the agent's main loop, not from the sender: on a dead link the sender can be stuck in
        flow control and would never look.
        """
        if not self._heartbeats_answered.is_set() or self._closing.is_set():
            return False
        if time.monotonic() - self._last_received <= self._silence_limit:
            return False
        log.warning(
            "no message from the coordinator for %.0f s although it answers heartbeats; reconnecting",
            time.monotonic() - self._last_received,
        )
        self._closing.set()
        self._tasks.reports_ready.set()
        if self._call is not None:
            self._call.cancel()
        return True

    def _drain_reports(self) -> list[agent_pb2.TaskReport]:
        reports = []
        while True:
            try:
                reports.append(self._tasks.reports.get_nowait())
            except queue.Empty:
                return reports

    def _unsent_batches(self, budget: int) -> Generator[agent_pb2.AgentMessage, None, bool]:
        """Yields up to `budget` batches of unsent lines and points; returns True when more are waiting."""
        for record in self._tasks.records():
            task_id = record.task_id
            while True:
                lines = record.logs.unacked(
                    after=self._sent_log_seq.get(task_id, 0), limit=BATCH_MAX_ITEMS, max_bytes=BATCH_MAX_BYTES
                )
                if not lines:
                    break
                if budget == 0:
                    return True
                budget -= 1
                self._sent_log_seq[task_id] = lines[-1].seq
                yield agent_pb2.AgentMessage(logs=agent_pb2.LogBatch(task_id=task_id, lines=lines))
            while True:
                points = record.metrics.unacked(
                    after=self._sent_metric_seq.get(task_id, 0),
                    limit=BATCH_MAX_ITEMS,
                    max_bytes=BATCH_MAX_BYTES,
                )
                if not points:
                    break
                if budget == 0:
                    return True
                budget -= 1
                self._sent_metric_seq[task_id] = points[-1].seq
                yield agent_pb2.AgentMessage(metrics=agent_pb2.MetricBatch(task_id=task_id, points=points))
        return False

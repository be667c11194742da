"""Simulated agents that speak the real agent protocol (proto/mwms/v1/agent.proto), many in one process.

Each `SimAgent` has its own gRPC channel (its own TCP connection, like a real agent on its own machine):
it registers with the join token, keeps one Connect stream open (Hello, then heartbeats at a chosen rate),
and times every heartbeat from the moment it is written to the moment its empty Ack arrives. A StartTask
is handled like the real agent does it, minus the process: confirm the port by binding it, fetch the
bundle, report STARTING and RUNNING, then SUCCEEDED (exit 0) after a chosen time (`SimConfig.task_run_s`,
or the job's own `--sim-run-s=SECONDS` / `--sim-run-s=forever` command argument, so one fleet runs short
and endless jobs side by side). A task can also stream log lines and metric points with per-task sequence
numbers, as fast as acknowledgements allow or at a chosen rate, and tracks the cumulative acks
(`Ack.log_seq` / `Ack.metric_seq`).

A StopTask ends the task at once (STOPPED, exit 0), or, with `SimConfig.stop_exit_code` set, the way a
runtime-based job answers SIGTERM: it saves for `stop_save_s` and exits with that code (42, "preempted and
saved"), unless the stop's grace runs out first, when it is killed (exit -9) and loses the steps since its
last checkpoint. Each job's training progress is simulated (`JobProgress`: steps at `steps_per_s`, resumed
from the job's last saved step), so a benchmark can count the steps a preemption cost.

With several coordinator replicas (`SimConfig.server` "a:1,b:2,c:3", or a list per agent from
`Simulator(server_order=...)`), an agent behaves like `mwms agent --server a,b,c` (worker_agent/main.py):
it starts on the first address, and when its stream breaks or registering fails it moves to the next one
on a fresh channel, waits a backoff (0.5 s growing to 3 s, +-50 % jitter; reset after a connection that
lasted 10 s), registers again with its credential and says hello, resending every log line and metric
point not yet acknowledged. Each stream is recorded (`StreamSession`: which server, when it opened, when
its first answer came: the hello was applied, since the coordinator reads a stream's messages in order and
the simulator writes a heartbeat right behind its hello), so a benchmark can time a failover.

Everything runs on one asyncio loop; `LoopLagMonitor` measures how late that loop runs, so a slow
simulator is visible in the results instead of being blamed on the coordinator.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import grpc

from mwms import agent_link
from mwms.loop import Backoff
from mwms.v1 import agent_pb2 as pb
from mwms.v1 import agent_pb2_grpc
from mwms.worker_agent.connection import BATCH_INTERVAL_SECONDS, BATCH_MAX_ITEMS

# As the real agent: at most BATCH_MAX_ITEMS per LogBatch / MetricBatch, and a task at a chosen rate sends
# what it has every BATCH_INTERVAL_SECONDS (a full batch at once).
# The real agent's link (receive limit, keepalive, flow control: mwms/agent_link.py); each channel gets its own
# subchannel pool, so every simulated agent has its own TCP connection.
CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1), *agent_link.channel_options()]
# An agent given several replicas uses the real agent's channel (worker_agent/channel.py): a replica that
# comes back is tried again within the agent's own backoff (not gRPC's default of up to 120 s), and the
# minimum backoff is also the connect timeout (0.5 s: a handshake slower than that fails, UNAVAILABLE).
REPLICA_CHANNEL_OPTIONS = [
    *CHANNEL_OPTIONS,
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 3_000),
]
# The real agent's reconnect delays (worker_agent/main.py): 0.5 s after a break, growing to 3 s, +-50 %.
RECONNECT_INITIAL_S = 0.5
RECONNECT_MAXIMUM_S = 3.0
HEALTHY_CONNECTION_S = 10.0
REGISTER_AGAIN_TIMEOUT_S = 10.0  # the real agent's REGISTER_TIMEOUT_SECONDS


@dataclass
class SimConfig:
    """How every simulated agent behaves."""

    join_token: str
    # One coordinator address, or several replicas' "a:1,b:2,c:3" (each agent starts on the first).
    server: str
    heartbeat_interval_s: float = 1.0
    # Seconds between RUNNING and SUCCEEDED; None: the task runs until `SimTask.finish()` or a StopTask.
    task_run_s: float | None = 0.0
    fetch_bundle: bool = True
    slots: int = 1
    port_base: int = 20_000
    ports_per_agent: int = 10
    # On a StopTask: None reports STOPPED at once (exit 0); a code (42: mwms.task_environment's
    # PREEMPTED_AND_SAVED_EXIT_CODE) is the exit status after saving for `stop_save_s`, if the grace allows.
    stop_exit_code: int | None = None
    stop_save_s: float = 0.5
    # The grace when the StopTask and the StartTask give none (the real agent's default).
    default_stop_grace_s: float = 10.0
    # Simulated training progress of every running task (JobProgress).
    steps_per_s: float = 10.0


# What a killed task's exit status reads as (SIGKILL after the grace ran out).
KILLED_EXIT_CODE = -9
RUN_S_ARGUMENT = "--sim-run-s="


def run_seconds(command: Iterable[str], default: float | None) -> float | None:
    """How long a task runs: the command's `--sim-run-s=SECONDS` (or `=forever`: None), else `default`."""
    for argument in command:
        if argument.startswith(RUN_S_ARGUMENT):
            value = argument.removeprefix(RUN_S_ARGUMENT)
            return None if value == "forever" else float(value)
    return default


@dataclass
class JobProgress:
    """Simulated training steps of every job, kept by its chief (task 0) across attempts.

    A chief resumes from the job's last saved step; on a stop it saves (exit 42) or is killed, and the
    steps past the last save are lost (counted per job).
    """

    saved_step: dict[str, int] = field(default_factory=dict)
    lost_steps: dict[str, int] = field(default_factory=dict)
    saves: dict[str, int] = field(default_factory=dict)

    def resume_step(self, job_id: str) -> int:
        return self.saved_step.get(job_id, 0)

    def chief_exited(self, job_id: str, step: int, stopped: bool, saved: bool) -> None:
        """A chief's exit: finished (its steps are the job's), or stopped and saved or not (then lost)."""
        if stopped and not saved:
            self.lost_steps[job_id] = self.lost_steps.get(job_id, 0) + step - self.resume_step(job_id)
            return
        self.lost_steps.setdefault(job_id, 0)
        self.saved_step[job_id] = step
        if stopped:
            self.saves[job_id] = self.saves.get(job_id, 0) + 1


@dataclass
class TelemetryPlan:
    """What a running task streams: items per second per kind (0: none, None: as fast as acks allow)."""

    metric_points_per_s: float | None = 0
    log_lines_per_s: float | None = 0
    # Items sent but not yet acknowledged, per task and kind, before the sender waits for an ack. Four
    # batches keep a coordinator that acks within a second busy at the ingest target (2,000 items/s per task
    # and kind); a bigger window only queues more (50 tasks x 2 kinds x window items in flight at most).
    window_items: int = 4 * BATCH_MAX_ITEMS


def server_list(server: str) -> list[str]:
    """The addresses of `SimConfig.server`: one, or the comma-separated replicas."""
    addresses = [address.strip() for address in server.split(",") if address.strip()]
    if not addresses:
        raise ValueError(f"no coordinator address in {server!r}")
    return addresses


@dataclass
class StreamSession:
    """One Connect stream of an agent: where, when it opened, when its first answer arrived, how it ended."""

    server: str
    opened_at: float
    answered_at: float | None = None
    ended_at: float | None = None
    error: str = ""


@dataclass
class SimTask:
    """One task the coordinator started on a simulated agent."""

    task_id: str
    job_id: str
    index: int
    port: int
    started_at: float
    attempt: int = 0
    running_at: float | None = None
    ended_at: float | None = None
    sent_log_seq: int = 0
    sent_metric_seq: int = 0
    acked_log_seq: int = 0
    acked_metric_seq: int = 0
    rejected: int = 0
    acked: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    final_acked: bool = False
    stopped: bool = False
    # Device indices the coordinator assigned, the stop's arrival and the exit status reported.
    device_indices: tuple[int, ...] = ()
    stop_received_at: float | None = None
    exit_code: int = 0
    resumed_from_step: int = 0
    step_at_exit: int | None = None
    stop_grace_s: int = 0
    final_report: pb.TaskReport | None = None

    def step(self, steps_per_s: float, now: float | None = None) -> int:
        """The simulated training step this task has reached."""
        if self.running_at is None:
            return self.resumed_from_step
        # Training stops at SIGTERM; the save (or the wait for SIGKILL) adds no steps.
        end = self.stop_received_at or self.ended_at or now or time.monotonic()
        return self.resumed_from_step + int((end - self.running_at) * steps_per_s)


class SimAgent:
    """One simulated agent: its own channel, credential and Connect stream."""

    def __init__(
        self,
        index: int,
        config: SimConfig,
        run_id: str,
        progress: JobProgress | None = None,
        servers: list[str] | None = None,
    ) -> None:
        self.index = index
        self.progress = progress if progress is not None else JobProgress()
        self.name = f"sim-{run_id}-{index:05d}"
        self.config = config
        # The replicas in the order this agent tries them (the real agent's --server list).
        self.servers = servers or server_list(config.server)
        self.server_index = 0
        self.channel_options = REPLICA_CHANNEL_OPTIONS if len(self.servers) > 1 else CHANNEL_OPTIONS
        self.channel = grpc.aio.insecure_channel(self.servers[0], options=self.channel_options)
        self.stub = agent_pb2_grpc.AgentServiceStub(self.channel)
        self.agent_id = ""
        self.credential = ""
        self.port_low = config.port_base + index * config.ports_per_agent
        self.tasks: dict[str, SimTask] = {}
        # Every task this agent was ever started with, also after its final ack.
        self.history: dict[str, SimTask] = {}
        self.telemetry: TelemetryPlan | None = None
        # (written at, round trip) of every acknowledged heartbeat, monotonic seconds.
        self.heartbeats: list[tuple[float, float]] = []
        # The server each of `heartbeats` was answered by (same order).
        self.heartbeat_servers: list[str] = []
        self.heartbeats_sent = 0
        self.stream_errors: list[str] = []
        self.register_errors: list[str] = []
        self.sessions: list[StreamSession] = []
        # When each StartTask arrived (monotonic), by task id: read off the stream, before it is handled.
        self.start_arrivals: dict[str, float] = {}
        self.refused_starts: list[str] = []
        self.connected = asyncio.Event()
        self._pending_heartbeats: deque[float] = deque()
        self._outbox: asyncio.Queue[pb.AgentMessage] = asyncio.Queue()
        self._bundles: set[str] = set()
        self._background: set[asyncio.Task[None]] = set()
        self._closing: set[grpc.aio.Channel] = set()
        # The heartbeat written right behind a hello, and when: its answer times the hello, not a beat.
        self._probe: pb.AgentMessage | None = None
        self._probe_sent_at: float | None = None

    @property
    def server(self) -> str:
        """The address this agent talks to now."""
        return self.servers[self.server_index]

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.credential}"),)

    async def register(self, timeout_s: float = 600) -> float:
        """Registers with the join token; returns the call's latency in seconds."""
        devices = [
            pb.Device(kind=pb.DEVICE_KIND_CPU_SLOT, index=i, name=f"cpu-slot-{i}")
            for i in range(self.config.slots)
        ]
        request = pb.RegisterRequest(
            name=self.name,
            hostname=self.name,
            advertise_address="127.0.0.1",
            port_range_low=self.port_low,
            port_range_high=self.port_low + self.config.ports_per_agent - 1,
            devices=devices,
            version="bench-simulator",
            join_token=self.config.join_token,
        )
        start = time.monotonic()
        # Registering again (after a reconnect) presents the credential, as the real agent does.
        metadata = self.metadata if self.credential else None
        response = await self.stub.Register(request, metadata=metadata, timeout=timeout_s)
        self.agent_id = response.agent_id
        self.credential = response.credential or self.credential  # none is issued on registering again
        return time.monotonic() - start

    async def run(self, stop: asyncio.Event) -> None:
        """Keeps a Connect stream open until `stop`; when it ends (recording why) reconnects like the real
        agent: the next replica (when there are several), a backoff, registering again, a new hello."""
        backoff = Backoff(initial=RECONNECT_INITIAL_S, maximum=RECONNECT_MAXIMUM_S)
        registered = True  # by `register`, before `run`
        while not stop.is_set():
            if not registered:
                try:
                    await self.register(timeout_s=REGISTER_AGAIN_TIMEOUT_S)
                except grpc.aio.AioRpcError as error:
                    if stop.is_set():
                        return
                    self.register_errors.append(f"{self.server} {error.code()}: {error.details()}")
                    if error.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                        return  # refused: every replica would refuse it (they share one database)
                    self._move_on()
                    await asyncio.sleep(backoff.next_delay())
                    continue
            registered = False
            opened_at = time.monotonic()
            try:
                await self._session(stop)
            except (grpc.RpcError, grpc.aio.AioRpcError) as error:  # type: ignore[misc]
                if stop.is_set():
                    return
                code = error.code() if isinstance(error, grpc.aio.AioRpcError) else None
                why = f"{code}: {getattr(error, 'details', lambda: '')()}"
                self.stream_errors.append(why)
                if self.sessions:
                    self.sessions[-1].error = why
                if code == grpc.StatusCode.UNAUTHENTICATED:
                    return  # removed or refused: a real agent would need a new join token
                self._move_on()
                if time.monotonic() - opened_at >= HEALTHY_CONNECTION_S:
                    backoff.reset()
                await asyncio.sleep(backoff.next_delay())

    def _move_on(self) -> None:
        """With several replicas: the next one, on a fresh channel (the old one closes in the background)."""
        if len(self.servers) < 2:
            return
        self.server_index = (self.server_index + 1) % len(self.servers)
        old, self.channel = self.channel, grpc.aio.insecure_channel(self.server, options=self.channel_options)
        self.stub = agent_pb2_grpc.AgentServiceStub(self.channel)
        self._closing.add(old)
        self._spawn(self._close_channel(old))

    async def _close_channel(self, channel: grpc.aio.Channel) -> None:
        try:
            await channel.close()
        finally:
            self._closing.discard(channel)

    async def _session(self, stop: asyncio.Event) -> None:
        call = self.stub.Connect(metadata=self.metadata)
        self._pending_heartbeats.clear()
        self._outbox = asyncio.Queue()
        # What the last stream sent but nobody acknowledged goes again (the coordinator keeps each seq once).
        for task in self.tasks.values():
            task.sent_log_seq = min(task.sent_log_seq, task.acked_log_seq)
            task.sent_metric_seq = min(task.sent_metric_seq, task.acked_metric_seq)
        session = StreamSession(self.server, time.monotonic())
        self.sessions.append(session)
        hello = pb.Hello(agent_id=self.agent_id, tasks=[self._report(t) for t in self.tasks.values()])
        await call.write(pb.AgentMessage(hello=hello))
        self._probe = pb.AgentMessage(heartbeat=pb.Heartbeat(sent_unix_ms=int(time.time() * 1000)))
        self._probe_sent_at = None
        self._outbox.put_nowait(self._probe)
        writer = asyncio.create_task(self._write(call))
        beater = asyncio.create_task(self._heartbeat(stop))
        stopper = asyncio.create_task(stop.wait())
        reader = asyncio.create_task(self._read(call, session))
        self.connected.set()
        try:
            done, _ = await asyncio.wait({writer, reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopper:
                    _reraise_as_stream_error(task)
        finally:
            session.ended_at = time.monotonic()
            self.connected.clear()
            for task in (writer, beater, stopper, reader):
                task.cancel()
            call.cancel()

    async def _heartbeat(self, stop: asyncio.Event) -> None:
        # A random phase, so a thousand agents do not beat in lockstep (real agents start at random times).
        await asyncio.sleep((self.index * 0.6180339887 % 1.0) * self.config.heartbeat_interval_s)
        while not stop.is_set():
            self._outbox.put_nowait(
                pb.AgentMessage(heartbeat=pb.Heartbeat(sent_unix_ms=int(time.time() * 1000)))
            )
            await asyncio.sleep(self.config.heartbeat_interval_s)

    async def _write(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            message = await self._outbox.get()
            if message.WhichOneof("body") == "heartbeat":
                now = time.monotonic()
                self._pending_heartbeats.append(now)
                if message is self._probe:
                    self._probe_sent_at = now
                else:
                    self.heartbeats_sent += 1
            await call.write(message)

    async def _read(self, call: grpc.aio.StreamStreamCall, session: StreamSession) -> None:
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "stream ended"
                )
            if session.answered_at is None:
                session.answered_at = time.monotonic()  # the hello before it was applied
            body = message.WhichOneof("body")
            if body == "ack":
                self._on_ack(message.ack)
            elif body == "start":
                self.start_arrivals.setdefault(message.start.task_id, time.monotonic())
                self._spawn(self._start(message.start))
            elif body == "stop":
                self._on_stop(message.stop)

    def _on_ack(self, ack: pb.Ack) -> None:
        if not ack.task_id and not ack.log_seq and not ack.metric_seq and not ack.final_state:
            if self._pending_heartbeats:  # one stream, handled in order: acks come back in send order
                sent = self._pending_heartbeats.popleft()
                if sent == self._probe_sent_at:  # the probe behind a hello: it timed the hello
                    self._probe_sent_at = None
                    return
                self.heartbeats.append((sent, time.monotonic() - sent))
                self.heartbeat_servers.append(self.server)
            return
        # From history: a batch's ack may follow the final ack (the coordinator stores batches on its own
        # schedule), and it still counts.
        task = self.history.get(ack.task_id)
        if task is None:
            return
        task.acked_log_seq = max(task.acked_log_seq, ack.log_seq)
        task.acked_metric_seq = max(task.acked_metric_seq, ack.metric_seq)
        task.rejected += ack.rejected
        task.acked.set()
        if ack.final_state:
            task.final_acked = True
            self.tasks.pop(ack.task_id, None)

    def _spawn(self, coroutine: object) -> None:
        task = asyncio.ensure_future(coroutine)  # type: ignore[arg-type]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _send(self, message: pb.AgentMessage) -> None:
        self._outbox.put_nowait(message)

    def _report(self, task: SimTask, exit_code: int = 0, message: str = "") -> pb.TaskReport:
        if task.ended_at is None:
            state = pb.TASK_STATE_RUNNING if task.running_at else pb.TASK_STATE_STARTING
        else:
            state = pb.TASK_STATE_STOPPED if task.stopped else pb.TASK_STATE_SUCCEEDED
            exit_code = exit_code or task.exit_code
        return pb.TaskReport(
            task_id=task.task_id, state=state, exit_code=exit_code, message=message, pid=4242
        )

    async def _start(self, start: pb.StartTask) -> None:
        if start.task_id in self.history:
            return  # a resend after a reconnect
        task = SimTask(
            start.task_id,
            start.job_id,
            start.task_index,
            start.port,
            time.monotonic(),
            attempt=start.attempt,
            device_indices=tuple(start.device_indices),
            resumed_from_step=self.progress.resume_step(start.job_id),
        )
        self.tasks[start.task_id] = task
        self.history[start.task_id] = task
        self._send(pb.AgentMessage(task=self._report(task)))  # STARTING
        problem = _port_problem(start.port)
        if problem is None and self.config.fetch_bundle and start.bundle_digest not in self._bundles:
            try:
                async for _ in self.stub.FetchBundle(
                    pb.FetchBundleRequest(digest=start.bundle_digest), metadata=self.metadata, timeout=60
                ):
                    pass
                self._bundles.add(start.bundle_digest)
            except grpc.aio.AioRpcError as error:
                problem = f"bundle fetch failed: {error.code()}"
        if problem is not None:
            self.refused_starts.append(problem)
            task.ended_at = time.monotonic()
            report = pb.TaskReport(task_id=task.task_id, state=pb.TASK_STATE_REJECTED, message=problem)
            self._send_final(task, report)
            task.done.set()
            return
        if task.stopped:  # stopped while starting: nothing was spawned
            task.ended_at = time.monotonic()
            self._send_final(task, self._report(task))
            return
        task.running_at = time.monotonic()
        self._send(pb.AgentMessage(task=self._report(task)))  # RUNNING
        streams = []
        if self.telemetry is not None:
            streams = [asyncio.create_task(self._stream_telemetry(task, self.telemetry))]
        run_s = run_seconds(start.command, self.config.task_run_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(task.done.wait(), timeout=run_s)
        if task.stopped:
            await self._exit_on_stop(task, start)
        task.done.set()
        for stream in streams:
            await stream  # the last lines and points go out before the final report, as with a real agent
        if task.ended_at is None:
            task.ended_at = time.monotonic()
            self._finish_steps(task, saved=False)  # a stop without stop_exit_code saves nothing
            self._send_final(task, self._report(task))

    async def _exit_on_stop(self, task: SimTask, start: pb.StartTask) -> None:
        """A stopped task's exit: at once, or saved within the grace (stop_exit_code), or killed after it."""
        code = self.config.stop_exit_code
        if code is None:
            return
        grace = task.stop_grace_s or start.stop_grace_seconds or self.config.default_stop_grace_s
        saves = self.config.stop_save_s <= grace
        await asyncio.sleep(self.config.stop_save_s if saves else grace)
        task.exit_code = code if saves else KILLED_EXIT_CODE
        task.ended_at = time.monotonic()
        self._finish_steps(task, saved=saves)
        self._send_final(task, self._report(task))

    def _send_final(self, task: SimTask, report: pb.TaskReport) -> None:
        task.final_report = report
        self._send(pb.AgentMessage(task=report))

    def _finish_steps(self, task: SimTask, saved: bool) -> None:
        task.step_at_exit = task.step(self.config.steps_per_s)
        if task.index == 0:
            self.progress.chief_exited(task.job_id, task.step_at_exit, task.stopped, saved)

    def _on_stop(self, stop: pb.StopTask) -> None:
        task = self.tasks.get(stop.task_id)
        if task is None:  # a task this agent does not know: report it stopped so it is not asked again
            report = pb.TaskReport(task_id=stop.task_id, state=pb.TASK_STATE_STOPPED, message=stop.reason)
            self._send(pb.AgentMessage(task=report))
            return
        if task.final_report is not None:  # ended already: its final report again, as the real agent does
            self._send(pb.AgentMessage(task=task.final_report))
            return
        if not task.stopped:
            task.stopped = True
            task.stop_received_at = time.monotonic()
            task.stop_grace_s = stop.grace_seconds
        task.done.set()

    async def _stream_telemetry(self, task: SimTask, plan: TelemetryPlan) -> None:
        """Sends log lines and metric points until the task is done, never more than the window unacked.

        At a chosen rate, what is due goes out as the real agent sends it (worker_agent/connection.py):
        a full batch at once, else what has gathered once BATCH_INTERVAL_SECONDS passed since the last batch
        of its kind; as fast as acks allow, full batches whenever the window has room."""
        started = time.monotonic()
        last_logs = last_metrics = started
        while not task.done.is_set():
            task.acked.clear()
            now = time.monotonic()
            elapsed = now - started
            sent_any = False
            if plan.log_lines_per_s != 0:
                due = _due(plan.log_lines_per_s, elapsed, task.sent_log_seq)
                room = plan.window_items - (task.sent_log_seq - task.acked_log_seq)
                count = min(BATCH_MAX_ITEMS, due, room)
                if count > 0 and (count == BATCH_MAX_ITEMS or now - last_logs >= BATCH_INTERVAL_SECONDS):
                    self._send(_log_batch(task, count))
                    last_logs = now
                    sent_any = True
            if plan.metric_points_per_s != 0:
                due = _due(plan.metric_points_per_s, elapsed, task.sent_metric_seq)
                room = plan.window_items - (task.sent_metric_seq - task.acked_metric_seq)
                count = min(BATCH_MAX_ITEMS, due, room)
                if count > 0 and (count == BATCH_MAX_ITEMS or now - last_metrics >= BATCH_INTERVAL_SECONDS):
                    self._send(_metric_batch(task, count))
                    last_metrics = now
                    sent_any = True
            if sent_any:
                await asyncio.sleep(0)  # let the writer and reader run between batches
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(task.acked.wait(), timeout=0.05)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        for channel in list(self._closing):
            await channel.close()
        await self.channel.close()


def _reraise_as_stream_error(task: asyncio.Task[None]) -> None:
    """A stream's reader or writer that ended: nothing when it returned, else a broken stream as an
    AioRpcError. gRPC raises others when a stream breaks under a write (a write after the call ended:
    InvalidStateError; one the channel cancelled: CancelledError); the agent must reconnect after those
    too, as the real agent does, not end with them."""
    if task.cancelled():
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "stream task cancelled"
        )
    error = task.exception()
    if error is None or isinstance(error, grpc.aio.AioRpcError):
        task.result()
        return
    raise grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        f"{type(error).__name__}: {error}",
    ) from error


def _due(rate: float | None, elapsed: float, sent: int) -> int:
    if rate is None:
        return BATCH_MAX_ITEMS
    return int(rate * elapsed) - sent


# Batches are filled in place (`add`): building each item and copying it into the batch took a third more
# of the simulator's CPU, which shares the machine with the coordinator it measures.


def _log_batch(task: SimTask, count: int) -> pb.AgentMessage:
    now_ms = int(time.time() * 1000)
    first = task.sent_log_seq + 1
    message = pb.AgentMessage()
    batch = message.logs
    batch.task_id = task.task_id
    add = batch.lines.add
    for seq in range(first, first + count):
        add(seq=seq, stream="stdout", text=f"step {seq} loss 0.{seq % 1000:03d} simulated", unix_ms=now_ms)
    task.sent_log_seq += count
    return message


def _metric_batch(task: SimTask, count: int) -> pb.AgentMessage:
    now_ms = int(time.time() * 1000)
    first = task.sent_metric_seq + 1
    message = pb.AgentMessage()
    batch = message.metrics
    batch.task_id = task.task_id
    add = batch.points.add
    for seq in range(first, first + count):
        add(seq=seq, name="loss", step=seq, value=1.0 / seq, unix_ms=now_ms)
    task.sent_metric_seq += count
    return message


def _port_problem(port: int) -> str | None:
    """Confirms the port as the real agent does: by binding it (and letting go)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as error:
            return f"port {port} is in use: {error}"
    return None


class LoopLagMonitor:
    """How late this process's event loop wakes up: the simulator's own overload, measured."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.lags: list[tuple[float, float]] = []

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            before = time.monotonic()
            await asyncio.sleep(self.interval_s)
            now = time.monotonic()
            self.lags.append((now, now - before - self.interval_s))


class Simulator:
    """A fleet of simulated agents on one event loop."""

    def __init__(
        self,
        config: SimConfig,
        count: int,
        run_id: str,
        server_order: Callable[[int], list[str]] | None = None,
    ) -> None:
        """`server_order(i)`: agent i's replica addresses in the order it tries them (default: the
        config's, the same for every agent)."""
        self.config = config
        self.progress = JobProgress()
        self.agents = [
            SimAgent(i, config, run_id, self.progress, server_order(i) if server_order else None)
            for i in range(count)
        ]
        self.stop = asyncio.Event()
        self.lag = LoopLagMonitor()
        self._runners: list[asyncio.Task[None]] = []

    async def register_all(self, concurrency: int = 1000, attempts: int = 5) -> list[float]:
        """Registers every agent, `concurrency` calls at a time; returns each call's latency (of the
        attempt that succeeded). A call that finds its server UNAVAILABLE (a connect that timed out) is
        tried again after the real agent's backoff, at most `attempts` times in all."""
        gate = asyncio.Semaphore(concurrency)

        async def one(agent: SimAgent) -> float:
            backoff = Backoff(initial=RECONNECT_INITIAL_S, maximum=RECONNECT_MAXIMUM_S)
            for attempt in range(attempts):
                try:
                    async with gate:
                        return await agent.register()
                except grpc.aio.AioRpcError as error:
                    if error.code() != grpc.StatusCode.UNAVAILABLE or attempt == attempts - 1:
                        raise
                    agent.register_errors.append(f"{agent.server} {error.code()}: {error.details()}")
                await asyncio.sleep(backoff.next_delay())
            raise AssertionError("unreachable")

        return list(await asyncio.gather(*(one(a) for a in self.agents)))

    async def connect_all(self, timeout_s: float = 120) -> None:
        """Opens every agent's stream and waits until each has had one heartbeat acknowledged."""
        self._runners.append(asyncio.create_task(self.lag.run(self.stop)))
        self._runners += [asyncio.create_task(a.run(self.stop)) for a in self.agents]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(a.heartbeats for a in self.agents):
                return
            await asyncio.sleep(0.1)
        waiting = sum(1 for a in self.agents if not a.heartbeats)
        raise TimeoutError(
            f"{waiting} of {len(self.agents)} agents had no heartbeat acknowledged in {timeout_s} s"
        )

    def round_trips(self, since: float, until: float, agents: list[SimAgent] | None = None) -> list[float]:
        """Round trips of heartbeats written within [since, until)."""
        return [rtt for a in agents or self.agents for sent, rtt in a.heartbeats if since <= sent < until]

    def unanswered(self, before: float, agents: list[SimAgent] | None = None, since: float = 0.0) -> int:
        """Heartbeats written in [since, before) that have no ack yet (still queued at the coordinator)."""
        return sum(
            sum(1 for sent in a._pending_heartbeats if since <= sent < before) for a in agents or self.agents
        )

    def tasks(self) -> list[SimTask]:
        """Every task any agent was started with."""
        return [t for a in self.agents for t in a.history.values()]

    def devices_assigned_twice(self) -> int:
        """Pairs of tasks that held the same device of one agent at overlapping times, as the agents saw
        it (from the StartTask to the final report): 0 unless the coordinator assigned a device twice."""
        overlaps = 0
        now = time.monotonic()
        for agent in self.agents:
            spans: dict[int, list[tuple[float, float]]] = {}
            for task in agent.history.values():
                for device in task.device_indices:
                    spans.setdefault(device, []).append((task.started_at, task.ended_at or now))
            for intervals in spans.values():
                intervals.sort()
                overlaps += sum(1 for a, b in zip(intervals, intervals[1:], strict=False) if b[0] < a[1])
        return overlaps

    async def close(self) -> None:
        self.stop.set()
        for runner in self._runners:
            runner.cancel()
        await asyncio.gather(*self._runners, return_exceptions=True)
        await asyncio.gather(*(a.close() for a in self.agents), return_exceptions=True)

"""The agent's life: register, keep a connection with the coordinator until told to stop, then stop its tasks.

Tasks outlive connections: when the coordinator restarts or the network breaks, the agent registers again
with backoff and opens a new connection that reports every task it still knows. The first registration
needs a join token and returns the agent's credential (worker_agent/credentials.py); later ones, also
after a restart of the agent, prove the agent's identity with that credential.

With several coordinator replicas (`--server a:50051,b:50051`), a failed registration or a broken stream
(UNAVAILABLE, DEADLINE_EXCEEDED, a stream gone silent) moves the agent to the next replica of the list on a
fresh channel (worker_agent/channel.py ServerRotation); a replica that works is kept until it fails. A
kill -9'd coordinator is noticed at once (its OS resets the connection), one that vanished silently within
the keepalive timeout (about 15 s, mwms/agent_link.py). A refusal is not retried elsewhere: the replicas
share one database, so what one refuses all refuse.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass

import grpc

import mwms
from mwms.loop import Backoff
from mwms.v1 import agent_pb2, agent_pb2_grpc
from mwms.worker_agent.agent_startup import build_confinement as build_confinement
from mwms.worker_agent.agent_startup import build_limits as build_limits
from mwms.worker_agent.agent_startup import build_port_guard as build_port_guard
from mwms.worker_agent.agent_startup import build_tasks
from mwms.worker_agent.agent_startup import coordinator_ports as coordinator_ports
from mwms.worker_agent.agent_startup import describe_devices as describe_devices
from mwms.worker_agent.channel import CHANNEL_OPTIONS, ChannelFactory, ServerRotation
from mwms.worker_agent.config import AgentConfig, local_address_towards, port_range_warning
from mwms.worker_agent.connection import AgentConnection
from mwms.worker_agent.credentials import CredentialStore
from mwms.worker_agent.device_telemetry import DeviceTelemetry, start_device_telemetry
from mwms.worker_agent.devices import detect_devices
from mwms.worker_agent.gpu_nodes import DriverPaths
from mwms.worker_agent.gpu_probe import vet_gpus
from mwms.worker_agent.sandbox import SandboxError
from mwms.worker_agent.task_users import TaskUserError
from mwms.worker_agent.tasks import TaskManager
from mwms.worker_agent.work_dir import WorkDirInUse, lock_work_dir, prepare_work_dir
from mwms.worker_agent.wrong_server import answers_http1, http1_server_sentence

log = logging.getLogger("mwms.agent")

EXIT_OK = 0
EXIT_REFUSED = 2
REGISTER_TIMEOUT_SECONDS = 10.0
DEFAULT_HEARTBEAT_SECONDS = 5.0
# A connection that lasted this long was healthy: the next reconnect starts with the shortest delay.
HEALTHY_CONNECTION_SECONDS = 10.0
# Delays between reconnects: 0.5 s (+-50 %) after a healthy connection broke, since another replica is
# likely up; growing to 3 s (+-50 %) while none answers. The jitter spreads the agents of a replica that
# died; the channel's own reconnect backoff is capped to match (worker_agent/channel.py).
RECONNECT_INITIAL_SECONDS = 0.5
RECONNECT_MAXIMUM_SECONDS = 3.0
# On shutdown, how long to wait for the coordinator to acknowledge the final reports.
FINAL_ACK_WAIT_SECONDS = 5.0
# The Goodbye's reason: the coordinator then holds the agent as stopped, not lost.
GOODBYE_REASON = "the agent was told to stop (SIGTERM or SIGINT: systemctl stop, Ctrl-C); its tasks ended"
# Codes after which registering again cannot help.
REFUSAL_CODES = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.ALREADY_EXISTS,
    }
)
__all__ = ["CHANNEL_OPTIONS", "EXIT_OK", "EXIT_REFUSED", "run_agent"]


class RegistrationRefused(Exception):
    """The coordinator refused this agent (bad join token or credential, name taken, invalid request)."""


def run_agent(config: AgentConfig, stop: threading.Event) -> int:
    """Runs the agent until `stop` is set; 0 after a clean stop, 2 when the coordinator refuses it."""
    hostname = socket.gethostname()
    servers = ServerRotation(config.servers)
    log.info("agent %s starting, coordinator %s", config.name, ", ".join(config.servers))
    ports_clash = port_range_warning(config)
    if ports_clash:
        log.warning("%s", ports_clash)
    prepare_work_dir(config.work_dir)
    try:
        work_dir_lock = lock_work_dir(config.work_dir, config.name)
    except WorkDirInUse as error:
        log.error("%s", error)
        return EXIT_REFUSED
    try:
        return _run_holding_the_work_dir(config, stop, hostname, servers)
    finally:
        work_dir_lock.close()


def _run_holding_the_work_dir(
    config: AgentConfig,
    stop: threading.Event,
    hostname: str,
    servers: ServerRotation,
) -> int:
    driver = DriverPaths.from_environment()
    try:
        confinement = build_confinement(config, driver)
    except (SandboxError, TaskUserError) as error:
        log.error("%s", error)
        return EXIT_REFUSED
    devices = detect_devices(
        config.slots,
        slots_given=config.slots_given,
        vet=lambda gpus: vet_gpus(gpus, confinement, driver),
    )
    log.info("offering %s", describe_devices(devices))
    cgroups, limits = build_limits(config, devices)
    port_guard = build_port_guard(config, cgroups)
    isolation = confinement.label() + ("; " + cgroups.describe() if cgroups else "; no cgroups")
    isolation += "; ports guarded" if port_guard else "; network not confined"
    credential = CredentialStore(config.work_dir)
    if credential.load():
        log.info("presenting the credential kept in %s", credential.path)
    channels = ChannelFactory(config, credential)
    channel = channels.open(servers.current)
    stub = agent_pb2_grpc.AgentServiceStub(channel)
    tasks = build_tasks(config, stub, hostname, confinement, devices, cgroups, limits, port_guard)
    # What a previous agent process left running is stopped while the agent registers and its stream
    # beats; the Hello reports it once stopped.
    tasks.recover_in_background(config.stop_grace)
    run = _Run(
        config=config,
        stop=stop,
        hostname=hostname,
        servers=servers,
        channels=channels,
        credential=credential,
        tasks=tasks,
        devices=devices,
        isolation=isolation,
        memory_bytes=limits.offered_memory_bytes,
        device_telemetry=start_device_telemetry(config.device_sample_interval),
        channel=channel,
        stub=stub,
    )
    try:
        exit_code = _keep_connected(run)
    finally:
        _shut_down(config, tasks, run.connection)
        if run.device_telemetry is not None:
            run.device_telemetry.stop()
        run.channel.close()
    log.info("agent %s stopped", config.name)
    return exit_code


@dataclass
class _Run:
    """What one run of the agent holds across its connections: the replicas and the channel to the current
    one, its credential, its tasks and what it offers."""

    config: AgentConfig
    stop: threading.Event
    hostname: str
    servers: ServerRotation
    channels: ChannelFactory
    credential: CredentialStore
    tasks: TaskManager
    devices: list[agent_pb2.Device]
    isolation: str
    memory_bytes: int
    device_telemetry: DeviceTelemetry | None
    channel: grpc.Channel
    stub: agent_pb2_grpc.AgentServiceStub
    connection: AgentConnection | None = None
    fell_back_to_join_token: bool = False

    def move_on(self, why: str) -> None:
        self.channel, self.stub = _move_on(self.channel, self.channels, self.servers, self.tasks, why)


def _keep_connected(run: _Run) -> int:
    """Registers and holds a connection, again after each break, until `run.stop` is set (0) or the
    coordinator refuses the agent (2)."""
    heartbeats_answered = threading.Event()
    backoff = Backoff(initial=RECONNECT_INITIAL_SECONDS, maximum=RECONNECT_MAXIMUM_SECONDS)
    while not run.stop.is_set():
        try:
            agent_id, heartbeat_interval = _register(
                run.stub,
                run.config,
                run.hostname,
                run.devices,
                run.credential,
                run.isolation,
                run.memory_bytes,
            )
        except RegistrationRefused as refusal:
            if _retry_with_join_token(run, refusal):
                continue
            return EXIT_REFUSED
        except grpc.RpcError as error:
            log.warning(
                "cannot register with %s yet: %s",
                run.servers.describe(),
                _describe(error, run.servers.current),
            )
            if len(run.servers) > 1:
                run.move_on("registering failed")
            run.stop.wait(backoff.next_delay())
            continue
        _hold_connection(run, agent_id, heartbeat_interval, heartbeats_answered, backoff)
    return EXIT_OK


def _retry_with_join_token(run: _Run, refusal: RegistrationRefused) -> bool:
    """Whether to register again with the join token after `refusal`; says in the log why not."""
    credential = run.credential
    if credential.get() and run.config.join_token and not run.fell_back_to_join_token:
        # A credential the coordinator no longer takes (the agent was removed, the database
        # replaced): the join token may admit the name again; it never takes over a live one.
        run.fell_back_to_join_token = True
        aside = credential.set_aside()
        log.warning(
            "the coordinator refused the saved credential (%s); moved it to %s and joining again "
            "with the join token",
            refusal,
            aside,
        )
        return True
    held = f" (it presented the credential in {credential.path})" if credential.get() else ""
    log.error("the coordinator refused this agent%s: %s", held, refusal)
    return False


def _hold_connection(
    run: _Run,
    agent_id: str,
    heartbeat_interval: float,
    heartbeats_answered: threading.Event,
    backoff: Backoff,
) -> None:
    """Holds the registered agent's stream until it ends or `run.stop` is set; after a break, moves on to
    the next replica where that helps and waits out the backoff."""
    log.info("registered as agent %s", agent_id)
    connection = AgentConnection(
        run.stub, agent_id, heartbeat_interval, run.tasks, heartbeats_answered, devices=run.device_telemetry
    )
    run.connection = connection
    opened_at = time.monotonic()
    connection.open()
    log.info("connected to coordinator %s", run.servers.describe())
    went_silent = False
    while not run.stop.is_set() and not connection.ended.is_set():
        went_silent = connection.end_if_silent() or went_silent
        run.stop.wait(0.1)
    if run.stop.is_set():
        return
    if len(run.servers) > 1 or went_silent:
        # A silent stream's channel is likely dead too; with replicas, the next one is likely alive.
        why = "the stream went silent" if went_silent else "the stream broke"
        run.move_on(why)
    if time.monotonic() - opened_at >= HEALTHY_CONNECTION_SECONDS:
        backoff.reset()
    run.stop.wait(backoff.next_delay())


def _move_on(
    channel: grpc.Channel,
    channels: ChannelFactory,
    servers: ServerRotation,
    tasks: TaskManager,
    why: str,
) -> tuple[grpc.Channel, agent_pb2_grpc.AgentServiceStub]:
    """Closes `channel` and opens a fresh one to the next replica (the same address when there is one)."""
    channel.close()
    previous = servers.describe()
    if len(servers) > 1:
        servers.advance()
        log.info("moving from coordinator %s to %s: %s", previous, servers.describe(), why)
    fresh = channels.open(servers.current)
    stub = agent_pb2_grpc.AgentServiceStub(fresh)
    tasks.use_stub(stub)
    return fresh, stub


def _register(
    stub: agent_pb2_grpc.AgentServiceStub,
    config: AgentConfig,
    hostname: str,
    devices: list[agent_pb2.Device],
    credential: CredentialStore,
    task_isolation: str,
    memory_bytes: int = 0,
) -> tuple[str, float]:
    """Registers (the interceptor presents the credential, if one is held); keeps a newly issued one."""
    request = agent_pb2.RegisterRequest(
        name=config.name,
        hostname=hostname,
        advertise_address=config.advertise_address or local_address_towards(config.servers[0]),
        port_range_low=config.port_low,
        port_range_high=config.port_high,
        devices=devices,
        version=mwms.__version__,
        join_token=config.join_token,
        task_isolation=task_isolation,
        memory_bytes=memory_bytes,
        warm_pool_size=config.warm_pool,
    )
    try:
        response = stub.Register(request, timeout=REGISTER_TIMEOUT_SECONDS)
    except grpc.RpcError as error:
        if isinstance(error, grpc.Call) and error.code() in REFUSAL_CODES:
            raise RegistrationRefused(_describe(error)) from error
        raise
    if response.credential:
        credential.save(response.credential)
        log.info("joined the coordinator; the agent's credential is kept in %s", credential.path)
    interval_ms = response.heartbeat_interval_ms
    return response.agent_id, interval_ms / 1000 if interval_ms > 0 else DEFAULT_HEARTBEAT_SECONDS


def _shut_down(config: AgentConfig, tasks: TaskManager, connection: AgentConnection | None) -> None:
    """Stops every task; while still connected, gives the coordinator a moment to store the final reports,
    then says goodbye, so the coordinator holds this agent as stopped rather than lost."""
    if tasks.records():
        log.info("stopping %d task(s)", len(tasks.records()))
    tasks.stop_all(config.stop_grace)
    if connection is None:
        return
    deadline = time.monotonic() + FINAL_ACK_WAIT_SECONDS
    while tasks.records() and not connection.ended.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    connection.close(goodbye=GOODBYE_REASON)


def _describe(error: grpc.RpcError, address: str = "") -> str:
    if isinstance(error, grpc.Call):
        details = error.details() or ""
        if address and answers_http1(details):  # the REST port given as --server (issue 31)
            return http1_server_sentence(address)
        return f"{error.code().name}: {details}"
    return str(error)

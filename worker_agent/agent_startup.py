"""What the agent sets up before it registers (worker_agent/main.py): the tasks' sandbox and users, the
devices it offers, the tasks' cgroups, limits and port rules, and the task manager that runs them."""

from __future__ import annotations

import logging

from mwms.sizes import format_size
from mwms.v1 import agent_pb2, agent_pb2_grpc
from mwms.worker_agent import landlock
from mwms.worker_agent.cgroups import AGENT_OOM_SCORE_ADJ, TaskCgroups, set_own_oom_score_adj
from mwms.worker_agent.cgroups import detect as detect_cgroups
from mwms.worker_agent.config import AgentConfig
from mwms.worker_agent.environments import EnvironmentCache
from mwms.worker_agent.gpu_nodes import DriverPaths, gpu_nodes
from mwms.worker_agent.port_guard import PortGuard
from mwms.worker_agent.port_guard import check as check_port_guard
from mwms.worker_agent.sandbox import Confinement, find_bwrap
from mwms.worker_agent.task_limits import LimitPolicy, machine_memory, offered_memory
from mwms.worker_agent.task_users import TaskUsers
from mwms.worker_agent.tasks import TaskManager
from mwms.worker_agent.warm_pool import WarmPool

log = logging.getLogger("mwms.agent")


def build_tasks(
    config: AgentConfig,
    stub: agent_pb2_grpc.AgentServiceStub,
    hostname: str,
    confinement: Confinement,
    devices: list[agent_pb2.Device],
    cgroups: TaskCgroups | None,
    limits: LimitPolicy,
    port_guard: PortGuard | None,
) -> TaskManager:
    """The task manager of this agent, with its cache of environments."""
    environments = EnvironmentCache(
        config.env_cache_dir or config.work_dir / "envs",
        config.env_cache_bytes,
        build_timeout_s=config.env_build_timeout,
        source_builds=config.env_source_builds,
    )
    gpus = gpu_nodes(devices)
    scope_sockets = abstract_socket_scope()
    pool = None
    if config.warm_pool > 0:
        pool = WarmPool(
            config.warm_pool, config.work_dir, confinement, gpus, cgroups, limits.pids_max, scope_sockets
        )
        log.info("keeping %d warm interpreter(s): TensorFlow imported before tasks arrive", config.warm_pool)
    return TaskManager(
        config.work_dir,
        stub,
        hostname,
        default_grace_seconds=config.stop_grace,
        confinement=confinement,
        environments=environments,
        gpus=gpus,
        cgroups=cgroups,
        limits=limits,
        port_guard=port_guard,
        scope_sockets=scope_sockets,
        warm_pool=pool,
    )


def build_limits(
    config: AgentConfig, devices: list[agent_pb2.Device]
) -> tuple[TaskCgroups | None, LimitPolicy]:
    """Each task's cgroup (where this agent may make them) and the limits it gets; says in the log what
    tasks are held to, and lowers the agent's own OOM score below its tasks'."""
    offered = offered_memory(machine_memory())
    policy = LimitPolicy(devices, offered, config.task_pids_max, config.task_disk_max)
    if set_own_oom_score_adj():
        log.info(
            "the agent's OOM score is lowered (oom_score_adj %d): tasks are killed first", AGENT_OOM_SCORE_ADJ
        )
    cgroups, why = detect_cgroups(config.work_dir)
    if cgroups is None:
        log.warning(
            "tasks are not held to their memory, processes or CPU: %s; start the agent as root, or under "
            "systemd with Delegate=yes",
            why,
        )
    else:
        log.info(
            "%s: memory %s for all tasks (shared by devices, or the job's --memory-per-worker), "
            "%d processes, files up to %s a task",
            cgroups.describe(),
            format_size(offered),
            config.task_pids_max,
            format_size(config.task_disk_max) if config.task_disk_max else "no limit",
        )
    return cgroups, policy


def build_port_guard(config: AgentConfig, cgroups: TaskCgroups | None) -> PortGuard | None:
    """The rules on tasks' ports (worker_agent/port_guard.py), tried once here; None, said in the log, where
    the kernel or the agent's privileges do not allow them."""
    guard = PortGuard((config.port_low, config.port_high), coordinator_ports(config.servers))
    parent = cgroups.bpf_parent if cgroups is not None else None
    why = (
        "no cgroup v2 hierarchy to attach them to"
        if parent is None
        else check_port_guard(guard, parent / "probe")
    )
    if why:
        log.warning(
            "tasks' network is not confined (%s): a task can reach other jobs' TensorFlow servers and bind "
            "their ports; run the agent as root on a kernel with cgroup BPF",
            why,
        )
        return None
    log.info(
        "tasks bind only their own port of %d-%d and reach those ports, and the coordinator's, only at their "
        "own job's peers",
        config.port_low,
        config.port_high,
    )
    return guard


def abstract_socket_scope() -> bool:
    """Whether tasks' host abstract unix sockets can be put out of reach (worker_agent/landlock.py)."""
    why = landlock.unavailable()
    if why:
        log.warning("tasks can reach the host's abstract unix sockets: %s", why)
        return False
    return True


def coordinator_ports(servers: tuple[str, ...]) -> list[int]:
    """The ports of the coordinators' gRPC endpoints ("host:port" each)."""
    ports = [entry.rpartition(":")[2] for entry in servers]
    return [int(port) for port in ports if port.isdigit()]


def build_confinement(config: AgentConfig, driver: DriverPaths | None = None) -> Confinement:
    """The sandbox and task users of `config`, checked to work here; says in the log what tasks get."""
    users = TaskUsers(config.task_user, config.task_uids)
    confinement = Confinement(config.work_dir, users, find_bwrap(config.sandbox), driver)
    if users.shared_with_agent:
        log.warning("%s", confinement.describe())
    else:
        log.info("%s", confinement.describe())
    return confinement


def describe_devices(devices: list[agent_pb2.Device]) -> str:
    """'2 GPU(s): NVIDIA H200, NVIDIA H200' or '1 CPU slot(s)'."""
    gpus = [device.name for device in devices if device.kind == agent_pb2.DEVICE_KIND_GPU]
    if gpus:
        return f"{len(gpus)} GPU(s): {', '.join(gpus)}"
    return f"{len(devices)} CPU slot(s)"

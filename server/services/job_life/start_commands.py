"""What a task's StartTask says, and when a start command is refused.

`start_spec` builds the plain values an agent is told to start a task with: the job's environment
(`job_env`, communication options included), and whether the gang's preflight check runs first and with
its all-reduce phase. The transport turns the spec into a message and measures it; a spec or message that
cannot be built, or one over the agents' receive limit, fails the task's job with the reason given here
(`agent_messages.refuse_start`), so that one damaged job never stops an agent's other commands.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mwms import task_environment
from mwms.agent_link import AGENT_RECEIVE_LIMIT_BYTES
from mwms.preflight_contract import ALLREDUCE_ENV
from mwms.server.db.models import Job, Task
from mwms.server.services.job_life.jobs import job_env
from mwms.server.services.observing.preflight import allreduce_wanted, preflight_wanted


@dataclass(frozen=True)
class StartDefaults:
    """The coordinator's settings a start command depends on."""

    stop_grace_s: int
    shared_checkpoint_dir: str = ""
    preemption_grace_s: int = 30  # for jobs that do not set preemption_grace_seconds
    preflight: bool = False  # for jobs that do not choose
    preflight_timeout_s: int = 120
    preflight_allreduce: bool = True
    # The coordinator's own ports (HTTP, gRPC): no task reaches them (StartTask.guarded_ports).
    own_ports: tuple[int, ...] = ()


@dataclass(frozen=True)
class StartSpec:
    """Everything a StartTask carries, as plain values; `preflight_timeout_s` is None without a check."""

    task_id: str
    job_id: str
    attempt: int
    task_index: int
    num_workers: int
    bundle_digest: str
    command: list[str]
    env: dict[str, str]
    tf_config: str
    port: int
    device_indices: list[int]
    device_kind: str  # "gpu" or "cpu"
    stop_grace_s: int
    restore_checkpoint: bool
    shared_checkpoint_dir: str
    preflight_timeout_s: int | None
    environment_lock: str = ""  # the job's own environment's pinned requirements; "": the agent's
    environment_python: str = ""
    environment_isolated: bool = False  # the lock alone, not extending the agents' runtime
    memory_limit_bytes: int = 0  # the job's memory_per_worker; 0: none (the agent applies its default share)
    cpus: float = 0.0  # the job's cpus_per_worker; 0: no cap
    guarded_ports: list[tuple[int, int]] = field(default_factory=list)


def start_spec(
    task: Task, job: Job, defaults: StartDefaults, agent_ranges: list[tuple[int, int]] | None = None
) -> StartSpec:
    """The start command of `task`; the preflight check runs first when the job (else the default) wants
    it, without its all-reduce phase when the default leaves it out (unless the job's env asks for it)."""
    env = job_env(job)
    env.setdefault(task_environment.PREEMPTION_GRACE_S, str(defaults.preemption_grace_s))
    preflight_s = defaults.preflight_timeout_s if preflight_wanted(job, defaults.preflight) else None
    if preflight_s is not None and not allreduce_wanted(job, defaults.preflight_allreduce):
        env.setdefault(ALLREDUCE_ENV, "0")
    return StartSpec(
        task_id=task.id,
        job_id=job.id,
        attempt=task.attempt_number,
        task_index=task.index,
        num_workers=job.num_workers,
        bundle_digest=job.bundle_digest,
        command=list(job.command),
        env=env,
        tf_config=task.tf_config,
        port=task.port,
        device_indices=list(task.device_indices),
        device_kind=task.device_kind,
        stop_grace_s=defaults.stop_grace_s,
        restore_checkpoint=task.attempt_number > 1,
        shared_checkpoint_dir=defaults.shared_checkpoint_dir,
        preflight_timeout_s=preflight_s,
        environment_lock=(job.environment or {}).get("locked") or "",
        environment_python=(job.environment or {}).get("python") or "",
        environment_isolated=bool((job.environment or {}).get("isolated")),
        memory_limit_bytes=job.memory_per_worker or 0,
        cpus=job.cpus_per_worker or 0.0,
        guarded_ports=[*(agent_ranges or []), *((p, p) for p in defaults.own_ports if p)],
    )


def unbuildable_reason(error: Exception) -> str:
    """Why a start command that raised `error` while being built is refused."""
    return f"its start command cannot be built ({type(error).__name__}: {str(error)[:200]})"


def oversize_reason(size: int) -> str | None:
    """Why a start command of `size` bytes is refused: it is over the agents' receive limit; None if it fits."""
    if size <= AGENT_RECEIVE_LIMIT_BYTES:
        return None
    return (
        f"its start command is {size} bytes, over the agents' receive limit of "
        f"{AGENT_RECEIVE_LIMIT_BYTES} bytes: make env and command smaller"
    )

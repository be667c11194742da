"""Pydantic request and response models: the REST API's contract (rendered at /docs)."""

from __future__ import annotations

import math
import re
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    Strict,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from mwms import environment_lock, task_environment
from mwms.metrics_line import NonFinite
from mwms.priorities import DEFAULT_PRIORITY, MAX_PRIORITY, PRIORITY_NAMES
from mwms.server.limits import (
    INT64_MAX,
    MAX_CPUS_PER_WORKER,
    MAX_MEMORY_PER_WORKER,
    MAX_NAME_CHARS,
    MAX_WORKERS,
    MIN_MEMORY_PER_WORKER,
)
from mwms.server.schema_types import (
    NAME_RULE,
    NO_NUL_PATTERN,
    OPTIONAL_NAME_PATTERN,
    PRINTABLE_PATTERN,
    PROGRAM_WORD_PATTERN,
    WHOLE_FLOATS_AS_INT,
    Integer,
    PrintableName,
    StrictBool,
    matching,
    pattern_in_schema,
)
from mwms.server.states import JobState
from mwms.sizes import format_size

DIGEST_PATTERN = r"^[0-9a-f]{64}$"
ENV_NAME_PATTERN = r"^[^=\u0000]+$"
# Names the agent sets or the spec derives (mwms/task_environment.py).
_REFUSED_ENV_NAMES: list[JsonValue] = [
    name for name in sorted(task_environment.RESERVED_ENV | task_environment.SPEC_ENV.keys())
]
_ENV_NAME = re.compile(ENV_NAME_PATTERN)


def _no_nul(value: str) -> str:
    # A program argument or environment value cannot hold NUL, and PostgreSQL text cannot store it.
    if "\x00" in value:
        raise ValueError("must not contain a NUL character (\\x00)")
    return value


def _finite(value: object) -> object:
    # Before the bounds are checked: NaN passes no comparison and would get a misleading message.
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} is not a timeout: {TIMEOUT_HELP}")
    return value


Text = Annotated[str, pattern_in_schema(NO_NUL_PATTERN), AfterValidator(_no_nul)]
Name = Annotated[
    str, Field(max_length=MAX_NAME_CHARS), pattern_in_schema(NO_NUL_PATTERN), AfterValidator(_no_nul)
]
TIMEOUT_HELP = "a finite number of seconds, at most MWMS_MAX_TIMEOUT_SECONDS (default 30 days)"
# A limit of the coordinator's settings in the document: server/api/openapi_document.py writes the
# setting's value in for the keyword (check_job_spec refuses what is over it).
SETTING_LIMIT = "x-mwms-setting-limit"
_TIMEOUT_LIMIT = {SETTING_LIMIT: {"maximum": "max_timeout_seconds"}}
Timeout = Annotated[
    float,
    Field(gt=0, description=TIMEOUT_HELP, json_schema_extra=_TIMEOUT_LIMIT),
    Strict(),
    BeforeValidator(_finite),
]
# Like Timeout, but 0 is allowed: it turns hang detection off for a job when the coordinator's default is on.
HangTimeout = Annotated[
    float,
    Field(ge=0, description="a finite number of seconds"),
    Strict(),
    BeforeValidator(_finite),
]


MAX_GRACE_SECONDS = 3600
# A SIGTERM-to-SIGKILL grace: the document states this coordinator's MWMS_MAX_PREEMPTION_GRACE_S too.
GraceSeconds = Annotated[
    int,
    Field(
        ge=0, le=MAX_GRACE_SECONDS, json_schema_extra={SETTING_LIMIT: {"maximum": "max_preemption_grace_s"}}
    ),
    Strict(),
    WHOLE_FLOATS_AS_INT,
]


def _memory_in_bounds(value: int) -> int:
    if not MIN_MEMORY_PER_WORKER <= value <= MAX_MEMORY_PER_WORKER:
        raise ValueError(
            f"{value} bytes is not a memory per worker: give bytes from {format_size(MIN_MEMORY_PER_WORKER)} "
            f"({MIN_MEMORY_PER_WORKER}) to {format_size(MAX_MEMORY_PER_WORKER)} ({MAX_MEMORY_PER_WORKER})"
        )
    return value


def _cpus_in_bounds(value: float) -> float:
    # NaN passes no comparison: refused here too, with the same words.
    if not (value > 0 and value <= MAX_CPUS_PER_WORKER):
        raise ValueError(
            f"{value} is not a number of CPUs per worker: give more than 0 and at most {MAX_CPUS_PER_WORKER} "
            "(fractions allowed, e.g. 0.5)"
        )
    return value


# Bytes of memory each worker may use (its tasks' cgroup limit); the bounds are in the document, the
# validator beside them refuses with what to give.
MemoryPerWorker = Annotated[
    int,
    Field(json_schema_extra={"minimum": MIN_MEMORY_PER_WORKER, "maximum": MAX_MEMORY_PER_WORKER}),
    Strict(),
    WHOLE_FLOATS_AS_INT,
    AfterValidator(_memory_in_bounds),
]
CpusPerWorker = Annotated[
    float,
    Field(json_schema_extra={"exclusiveMinimum": 0, "maximum": MAX_CPUS_PER_WORKER}),
    Strict(),
    AfterValidator(_cpus_in_bounds),
]


class CommunicationImplementation(str, Enum):
    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"


class CommunicationOptions(BaseModel):
    """tf.distribute.experimental.CommunicationOptions for the job's collectives."""

    model_config = ConfigDict(extra="forbid")

    implementation: CommunicationImplementation | None = Field(
        default=None, description="AUTO, RING or NCCL; default NCCL when tasks have GPUs, else AUTO"
    )
    timeout_seconds: Timeout | None = None
    bytes_per_pack: Annotated[int, Field(ge=0, le=INT64_MAX), Strict(), WHOLE_FLOATS_AS_INT] | None = None


class RestartOn(str, Enum):
    RETRYABLE = "retryable"  # exit codes >= 128 (signals, OOM kills) and lost agents
    ANY = "any"  # any non-zero exit


class RestartPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_restarts: Integer = Field(default=3, ge=0, le=1000)
    restart_on: RestartOn = RestartOn.RETRYABLE
    fail_on_nan: list[Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]] = Field(
        default_factory=list,
        max_length=32,
        description="metric names (e.g. ['loss']) whose NaN value fails the job at once, without a restart",
    )


# A band's name in any case, spaces around it allowed: spelled out letter by letter, since ECMA regexes
# have no inline flags.
PRIORITY_NAME_PATTERN = r"^ *(?:[lL][oO][wW]|[nN][oO][rR][mM][aA][lL]|[hH][iI][gG][hH]) *$"
_PRIORITY_NAME = re.compile(PRIORITY_NAME_PATTERN)
PRIORITY_HELP = (
    "0-1000, higher first; or low (250), normal (500), high (750). Users may give at most "
    "MWMS_USER_PRIORITY_CEILING (default 500); admins any"
)


def _priority_value(value: Any) -> Any:
    """A priority band name (low, normal, high) as its number; numbers pass through to be bounded."""
    if isinstance(value, str) and _PRIORITY_NAME.fullmatch(value):
        return PRIORITY_NAMES[value.strip().lower()]
    return value


Priority = Annotated[
    int,
    Field(ge=0, le=MAX_PRIORITY),
    Strict(),
    WHOLE_FLOATS_AS_INT,
    BeforeValidator(_priority_value),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 0, "maximum": MAX_PRIORITY},
                {"type": "string", "pattern": PRIORITY_NAME_PATTERN},
            ],
            "description": PRIORITY_HELP,
        }
    ),
]


def _pinned(value: str) -> str:
    environment_lock.pinned_packages(value)  # LockError (a ValueError) names the line and what to do
    return value


class EnvironmentIn(BaseModel):
    """A job's own Python environment: what the submitter resolved once (mwms submit --requirements)."""

    model_config = ConfigDict(extra="forbid")

    requirements: Annotated[
        str,
        Field(max_length=environment_lock.MAX_REQUIREMENTS_PATH_CHARS),
        pattern_in_schema(NO_NUL_PATTERN),
        AfterValidator(_no_nul),
    ] = Field(default="", description="the file it was resolved from (shown only), e.g. requirements.txt")
    python: str | None = Field(
        default=None,
        pattern=environment_lock.PYTHON_PATTERN,
        description="the Python version to build it with (\"3.11\"); default: the agent's own interpreter's",
    )
    locked: Annotated[
        str,
        Field(max_length=environment_lock.MAX_LOCK_CHARS),
        pattern_in_schema(environment_lock.LOCK_PATTERN),
        AfterValidator(_pinned),
    ] = Field(
        description="requirements.txt text with every requirement pinned (name==version, markers and --hash "
        "allowed; no options, URLs or ranges), as `uv pip compile --universal` writes it; every worker "
        "installs exactly these, with uv, from the index its agent's operator configured"
    )
    isolated: bool = Field(
        default=False,
        description="false (default): the environment extends the agents' runtime, so TensorFlow, tf-keras "
        "and numpy stay importable and the lock's packages take precedence over them; true: it holds the "
        "lock alone (and mwms_runtime), so the lock must pin TensorFlow itself",
    )


class EnvironmentOut(BaseModel):
    requirements: str = Field(description="the file it was resolved from")
    python: str | None = Field(description="the Python version asked for; null: the agents' own")
    isolated: bool = Field(
        description="true: the lock alone; false: it extends the agents' runtime (TensorFlow, tf-keras, numpy)"
    )
    packages: list[str] = Field(description="the resolved packages, name==version")


class JobCreate(BaseModel):
    """What `POST /api/v1/jobs` takes.

    Rules across fields, which JSON Schema cannot state, refused with 422 naming the rule: `agents`, when
    given, names exactly `workers` agents; `command`'s arguments together are at most
    MWMS_MAX_COMMAND_BYTES bytes; `env`'s names and values together are at most MWMS_MAX_ENV_TOTAL_BYTES
    bytes. A `bundle_digest` that no uploaded bundle has is a 404.
    """

    model_config = ConfigDict(extra="forbid")

    name: Name | None = None
    bundle_digest: str = Field(pattern=DIGEST_PATTERN, description="sha256 of an uploaded bundle")
    command: list[Text] = Field(
        min_length=1,
        description="argv run in the bundle's directory, its first word a program; at most "
        "MWMS_MAX_COMMAND_ARGS arguments and MWMS_MAX_COMMAND_BYTES bytes",
        json_schema_extra={
            "prefixItems": [{"type": "string", "pattern": PROGRAM_WORD_PATTERN}],
            SETTING_LIMIT: {"maxItems": "max_command_args"},
        },
    )
    workers: Integer = Field(ge=1, le=MAX_WORKERS, description="number of MWMS workers (tasks)")
    gpus_per_worker: Integer = Field(default=0, ge=0, le=64, description="0 runs on CPU slots")
    memory_per_worker: MemoryPerWorker | None = Field(
        default=None,
        description="bytes of memory each worker may use (64 MiB to 64 TiB): its tasks' limit, past which "
        "the agent kills them (out of memory), and what placement counts against each agent's memory; "
        "null: no reservation, the agent applies its default share",
    )
    cpus_per_worker: CpusPerWorker | None = Field(
        default=None,
        description="CPUs each worker may use at most (more than 0, at most 1024; fractions allowed): a cap "
        "on its tasks' CPU time, not a reservation; null: no cap",
    )
    env: dict[str, Text] = Field(
        default_factory=dict,
        description="at most MWMS_MAX_ENV_VARS variables; names, values and their total bounded by "
        "MWMS_MAX_ENV_NAME_BYTES, MWMS_MAX_ENV_VALUE_BYTES and MWMS_MAX_ENV_TOTAL_BYTES; names the agent "
        "sets or the spec derives are refused",
        json_schema_extra={
            SETTING_LIMIT: {"maxProperties": "max_env_vars"},
            "propertyNames": {
                "minLength": 1,
                "pattern": ENV_NAME_PATTERN,
                "not": {"enum": _REFUSED_ENV_NAMES},
            },
        },
    )
    communication: CommunicationOptions = Field(default_factory=CommunicationOptions)
    restart: RestartPolicy = Field(default_factory=RestartPolicy)
    startup_timeout_seconds: Timeout | None = None
    max_runtime_seconds: Timeout | None = None
    hang_timeout_seconds: HangTimeout | None = Field(
        default=None,
        description="a RUNNING attempt whose tasks produce no metric point and no log line for this long is "
        "flagged as hung: its stacks are dumped and the restart policy applies (retryable); default "
        "MWMS_HANG_TIMEOUT_S, 0 turns detection off",
    )
    preflight: StrictBool | None = Field(
        default=None,
        description="run the gang's preflight check (peers reachable, all-reduce of 1 MB and 64 MB) before "
        "the program; default MWMS_PREFLIGHT",
    )
    priority: Priority = DEFAULT_PRIORITY
    preemptible: StrictBool = Field(
        default=True,
        description="false: never preempted (then it never borrows idle capacity over its team's quota); "
        "admins may keep users from opting out (MWMS_USERS_MAY_OPT_OUT_OF_PREEMPTION)",
    )
    preemption_grace_seconds: GraceSeconds | None = Field(
        default=None,
        description="seconds between the SIGTERM that preempts the job's workers and the SIGKILL; default "
        "MWMS_PREEMPTION_GRACE_S, at most MWMS_MAX_PREEMPTION_GRACE_S",
    )
    agents: list[Name] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_WORKERS,
        description="pins worker i to agents[i] (an agent's id, else its name), one entry per worker (as "
        "many as workers); the "
        "job stays PENDING, saying why, while a named agent is offline or busy; a value that is one agent's "
        "id and another's name is refused (400)",
    )
    environment: EnvironmentIn | None = Field(
        default=None,
        description="a Python environment of the job's own, built on each agent with uv and cached there; "
        "null: tasks run in the agent's environment",
    )

    @field_validator("command")
    @classmethod
    def _command_not_blank(cls, value: list[str]) -> list[str]:
        if not value[0].strip():
            raise ValueError("the first word of command must be a program, e.g. ['python', 'train.py']")
        return value

    @model_validator(mode="after")
    def _one_agent_per_worker(self) -> JobCreate:
        if self.agents is not None and len(self.agents) != self.workers:
            raise ValueError(
                f"agents names {len(self.agents)} agents for {self.workers} workers: give one per worker "
                "(the same agent twice runs two workers there)"
            )
        return self

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _ENV_NAME.fullmatch(key):
                raise ValueError(f"invalid environment variable name {key!r}: no '=' or NUL, not empty")
        # Names the agent sets or the spec derives (mwms/task_environment.py), all named at once.
        refused = task_environment.refused_names(value)
        if refused is not None:
            raise ValueError(refused)
        return value


class PriorityChange(BaseModel):
    """What `POST /api/v1/jobs/{id}/priority` takes."""

    model_config = ConfigDict(extra="forbid")

    priority: Priority


DEVICE_UUIDS_DESCRIPTION = (
    'the UUID of each GPU of device_indices, in the same order, as its agent registered it ("" where '
    "unknown); empty for a CPU task"
)
DEVICE_UUID_DESCRIPTION = 'the GPU\'s UUID, as its agent registered it ("" where unknown)'


class TaskOut(BaseModel):
    id: str
    index: int
    attempt: int
    agent_id: str
    agent_name: str
    address: str
    state: str
    exit_code: int | None
    message: str
    pid: int | None = Field(description="process id on the agent's machine while it runs")
    device_kind: str
    device_indices: list[int] = Field(description="the host's indices of the devices it holds")
    device_uuids: list[str] = Field(default_factory=list, description=DEVICE_UUIDS_DESCRIPTION)
    tf_config: str
    started_at: datetime | None
    ended_at: datetime | None
    environment: str = Field(
        default="",
        description="the job's own environment on this task's agent: building, ready, or empty (none, or "
        "not reported yet)",
    )
    environment_build_seconds: float | None = Field(
        default=None, description="how long its build took on this agent; 0: found in the agent's cache"
    )
    peak_memory_bytes: int | None = Field(
        default=None,
        description="the most memory the task has held so far, as its agent measured it (its cgroup); null: "
        "not reported",
    )
    memory_limit_bytes: int | None = Field(
        default=None,
        description="the memory limit its agent applied: the job's memory_per_worker, else the agent's "
        "share for tasks; null: none reported",
    )
    ended_attempt: bool = Field(
        default=False,
        description="its own failure (or its lost agent) ended its attempt: the worker that failed; the "
        "others were stopped because of it",
    )


# A job shows this many of its newest attempts (attempt_history); `attempts` counts them all.
ATTEMPTS_SHOWN = 20


class AttemptEndingOut(BaseModel):
    """Why an attempt ended and what acted on it (server/services/attempt_endings.py lists the kinds)."""

    kind: str = Field(
        description="succeeded, preempted, reclaimed, drained, agent_lost, task_failed, hang, startup_timeout, "
        "environment_mismatch, refused, start_failed, cancelled, runtime_limit, nan_metric; unrecorded: it "
        "ended before endings were recorded"
    )
    message: str = Field(
        description="the ending in words, e.g. 'preempted by job 3f2a9c1d0b4e (priority 900)'"
    )
    job_id: str | None = Field(default=None, description="preempted, reclaimed: the job it made room for")
    priority: int | None = Field(default=None, description="preempted, reclaimed: that job's priority then")
    team: str | None = Field(default=None, description="reclaimed: the team that took its quota back")
    agent: str | None = Field(
        default=None, description="drained, agent_lost, task_failed, refused: the agent's name"
    )
    agent_id: str | None = Field(default=None, description="that agent's id")
    task: int | None = Field(
        default=None, description="agent_lost, task_failed, refused, start_failed: the task's index"
    )
    exit_code: int | None = Field(default=None, description="task_failed: the task's exit code, if any")
    by: str | None = Field(default=None, description="cancelled, drained: the user who did it, if known")
    restart: int | None = Field(default=None, description="the restart this failure led to; null: none")
    restart_cause: str | None = Field(
        default=None,
        description="that restart's cause as mwms_job_restarts_total counts it: agent_lost, signal, "
        "exit_code, hang, startup_timeout, other",
    )
    details: dict[str, Any] = Field(
        default_factory=dict,
        description="the kind's other details: how (agent_lost: silent, stopped, removed, forgot), note, "
        "timeout_s, workers, limit_s, metric, step, max_restarts",
    )


class AttemptEventOut(BaseModel):
    from_state: str | None
    to_state: str
    reason: str
    at: datetime
    cause: str = Field(default="", description="an ending's kind (AttemptEndingOut.kind); empty otherwise")


class AttemptOut(BaseModel):
    number: int
    state: str
    reason: str
    created_at: datetime
    ended_at: datetime | None
    tasks: list[TaskOut]
    ended: AttemptEndingOut | None = Field(
        default=None, description="why it ended and what acted on it; null while it is ACTIVE"
    )
    events: list[AttemptEventOut] = Field(
        default_factory=list, description="its state changes, oldest first (placed, then how it ended)"
    )


class JobEventOut(BaseModel):
    from_state: str | None
    to_state: str
    reason: str
    at: datetime


class JobSummary(BaseModel):
    id: str
    name: str
    state: JobState
    reason: str
    workers: int
    gpus_per_worker: int
    memory_per_worker: int | None = Field(default=None, description="bytes per worker, as submitted")
    cpus_per_worker: float | None = Field(default=None, description="CPUs per worker, as submitted")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    attempts: int
    restarts: int
    step: int | None = Field(description="latest reported step of the current attempt")
    loss: float | NonFinite | None = Field(
        description='latest reported loss: a number, or "NaN", "Infinity" or "-Infinity"'
    )
    submitted_by: str = Field(description="the user whose token submitted the job")
    team: str = Field(default="", description="the submitter's team when the job was submitted")
    priority: int = Field(default=DEFAULT_PRIORITY, description="0-1000, higher is placed first")
    preemptible: bool = True
    waiting: dict[str, Any] = Field(
        default_factory=dict,
        description="why a waiting job waits, typed: kind (over_quota, no_fit, reserved, behind_priority, "
        "cordoned, pinned, preempting, connecting) and its details, estimated_start when known; {} once placed",
    )
    cancelled_by: str = Field(description="the user who cancelled the job; empty when nobody did")


class JobOut(JobSummary):
    command: list[str]
    bundle_digest: str
    env_names: list[str]
    communication: CommunicationOptions
    restart: RestartPolicy
    startup_timeout_seconds: float | None
    max_runtime_seconds: float | None
    preflight: bool | None = Field(default=None, description="as submitted; None: the coordinator's default")
    agents: list[str] | None = Field(default=None, description="worker i runs on agents[i], when set")
    preemption_grace_seconds: int | None = Field(default=None, description="as submitted")
    environment: EnvironmentOut | None = Field(default=None, description="the job's own Python environment")
    tasks: list[TaskOut] = Field(description="tasks of the newest attempt")
    latest_stacks: str | None = Field(
        default=None,
        description="the id of the job's newest stack dump (GET /api/v1/jobs/{id}/stacks answers it); null: "
        "none taken yet, and that GET answers 404",
    )
    attempt_history: list[AttemptOut] = Field(
        description=f"the newest {ATTEMPTS_SHOWN} attempts, oldest first; `attempts` counts them all"
    )
    events: list[JobEventOut]


class JobPage(BaseModel):
    jobs: list[JobSummary]
    total: int
    offset: int
    limit: int


class LogLineOut(BaseModel):
    id: int
    task: int
    attempt: int
    seq: int
    stream: str
    text: str
    at: datetime
    redraw: bool = Field(
        default=False,
        description="a newer state of the line before it of this task and stream (a `\\r` redraw, such as "
        "a progress bar): it replaces that line",
    )


class LogPage(BaseModel):
    lines: list[LogLineOut]
    next_after: int = Field(description="pass as ?after= to get only newer lines")


class MetricPointOut(BaseModel):
    name: str
    step: int
    value: float | NonFinite = Field(description='a number, or "NaN", "Infinity" or "-Infinity"')
    wall_time: datetime
    attempt: int


class MetricSeries(BaseModel):
    points: list[MetricPointOut]
    cursor: int = Field(
        description="pass as `after` to read only the points stored after these (0: none stored yet)"
    )
    more: bool = Field(
        description="true: more points match than this page holds; read on with after=cursor (pages read "
        "after a cursor are in storage order)"
    )


class DeviceOut(BaseModel):
    kind: str
    index: int
    name: str
    uuid: str = ""
    node: str = Field(
        default="",
        description='its device file on the agent\'s machine, e.g. "/dev/nvidia3"; empty for CPU slots and '
        "from agents that do not report it",
    )
    memory_mib: int = 0


class AgentTaskOut(BaseModel):
    job_id: str
    job_name: str
    task_index: int
    attempt: int
    state: str
    device_indices: list[int] = Field(description="the host's indices of the devices it holds")
    device_uuids: list[str] = Field(default_factory=list, description=DEVICE_UUIDS_DESCRIPTION)


class AgentOut(BaseModel):
    id: str
    name: str
    hostname: str
    address: str
    port_range: str
    version: str
    task_isolation: str = Field(
        "", description="How the agent confines its tasks, e.g. 'bwrap sandbox; a uid per job'"
    )
    online: bool
    state: Literal["online", "stopped", "lost", "removed"] = Field(
        "online",
        description="online (heard from within the agent timeout); stopped (it said goodbye: a clean stop "
        "such as `systemctl stop`); lost (silent past the agent timeout without a goodbye); removed by an admin",
    )
    stopped_at: datetime | None = Field(None, description="when it said goodbye; null unless stopped")
    lost_at: datetime | None = Field(None, description="when the coordinator handled it as lost; null if not")
    last_heartbeat_at: datetime | None
    devices: list[DeviceOut]
    memory_bytes: int | None = Field(
        default=None,
        description="memory the agent offers its tasks in all (placement counts jobs' memory_per_worker "
        "against it); null: not reported",
    )
    devices_used: int
    devices_free: int
    tasks: list[AgentTaskOut]
    cordoned: bool = Field(default=False, description="no new jobs are placed on it (`mwms agent cordon`)")
    cordoned_at: datetime | None = None
    cordoned_by: str = Field(default="", description="the admin who cordoned or drained it")
    cordon_reason: str = ""
    draining: bool = Field(
        default=False, description="drained: its jobs were preempted (or are let finish) to run elsewhere"
    )
    drained: bool = Field(default=False, description="draining, and no task holds its devices any more")


class BundleOut(BaseModel):
    digest: str
    size: int
    format: str
    created: bool = Field(description="false when this content was already stored")


class ArtifactOut(BaseModel):
    path: str
    size: int
    sha256: str
    attempt: int
    created_at: datetime


class Overview(BaseModel):
    agents_online: int
    agents_lost: int
    agents_stopped: int = Field(0, description="agents that said goodbye (a clean stop): not counted as lost")
    devices_busy: int
    devices_free: int
    jobs_running: int
    jobs_pending: int


class ErrorOut(BaseModel):
    """Every error response but 422: what was wrong and what to do about it."""

    detail: str


class ValidationIssue(BaseModel):
    loc: list[str | int] = Field(description="where: 'body', 'query' or 'path', then the field's path")
    msg: str
    type: str


class ValidationErrorOut(BaseModel):
    """A 422: every problem in one sentence (`detail`), and each one on its own (`errors`)."""

    detail: str
    errors: list[ValidationIssue]


class RoleName(str, Enum):
    ADMIN = "admin"
    USER = "user"
    VIEWER = "viewer"


MAX_TOKEN_LIFETIME_S = 10 * 365 * 86400
MAX_TOKEN_NAME_CHARS = 200
Lifetime = Annotated[int, Field(gt=0, le=MAX_TOKEN_LIFETIME_S), Strict(), WHOLE_FLOATS_AS_INT]


class TokenCreate(BaseModel):
    """A new API token for a user."""

    model_config = ConfigDict(extra="forbid")

    user: PrintableName = Field(
        min_length=1,
        max_length=MAX_TOKEN_NAME_CHARS,
        description=f"who the token belongs to; owns their jobs: {NAME_RULE}",
    )
    role: RoleName = RoleName.USER
    name: Annotated[
        str,
        Field(json_schema_extra={"pattern": OPTIONAL_NAME_PATTERN}),
        matching(OPTIONAL_NAME_PATTERN, "empty or " + NAME_RULE),
    ] = Field(
        default="",
        max_length=MAX_TOKEN_NAME_CHARS,
        description="a label, e.g. the machine it is used on; default: the user",
    )
    expires_in_seconds: Lifetime | None = None


class JoinTokenCreate(BaseModel):
    """A new join token that admits agents."""

    model_config = ConfigDict(extra="forbid")

    name: PrintableName = Field(
        default="agents", min_length=1, max_length=MAX_TOKEN_NAME_CHARS, description=NAME_RULE
    )
    expires_in_seconds: Lifetime | None = None


class TokenOut(BaseModel):
    """A token as listed: never its secret."""

    id: str
    kind: str
    name: str
    user: str
    role: str
    created_by: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class TokenCreated(TokenOut):
    token: str = Field(description="the secret; shown only in this response")


class LoginRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token: str = Field(min_length=1, max_length=500)


class WhoAmI(BaseModel):
    user: str
    role: RoleName
    token_name: str
    via_session: bool


# --- device telemetry (issue 11) ---


class DeviceSampleOut(BaseModel):
    """One device's newest sample (GPU, through NVML on its agent), as the coordinator received it."""

    index: int
    uuid: str = Field(default="", description=DEVICE_UUID_DESCRIPTION)
    utilization_pct: float
    memory_used_mib: int
    memory_total_mib: int
    temperature_c: float
    at: datetime


class DevicePointOut(BaseModel):
    """One bucket of a device's series: mean utilisation and temperature, highest memory use."""

    at: datetime
    utilization_pct: float
    memory_used_mib: int
    memory_total_mib: int
    temperature_c: float


class DeviceSeriesOut(BaseModel):
    index: int
    uuid: str = Field(default="", description=DEVICE_UUID_DESCRIPTION)
    points: list[DevicePointOut]


class AgentDevicesOut(BaseModel):
    agent_id: str
    latest: list[DeviceSampleOut] = Field(description="the newest sample of each device")
    bucket_seconds: int = Field(description="the width of one point of the series")
    series: list[DeviceSeriesOut]
    refused: int = Field(description="samples from this agent refused since the coordinator started")


class AgentLatestDevicesOut(BaseModel):
    agent_id: str
    devices: list[DeviceSampleOut]


class TaskDevicesOut(BaseModel):
    task_index: int
    agent_id: str
    agent_name: str
    device_kind: str
    device_indices: list[int] = Field(description="the host's indices of the devices it holds")
    device_uuids: list[str] = Field(default_factory=list, description=DEVICE_UUIDS_DESCRIPTION)
    started_at: datetime | None
    ended_at: datetime | None
    series: list[DeviceSeriesOut] = Field(description="empty for CPU tasks and tasks that never started")


class JobDevicesOut(BaseModel):
    job_id: str
    attempt: int | None
    bucket_seconds: int
    tasks: list[TaskDevicesOut]


# --- end of device telemetry ---


class PreflightResultOut(BaseModel):
    """What one task's preflight check found (report: see mwms/preflight_contract.py)."""

    task_index: int
    task_id: str
    ok: bool
    message: str
    at: datetime
    report: dict[str, Any] = Field(
        description="reachable_s, peers, tcp, collective, allreduce [{bytes, seconds, algbw_gbps, busbw_gbps}]"
    )


class PreflightAttemptOut(BaseModel):
    attempt: int
    ok: bool = Field(description="every task that reported passed")
    results: list[PreflightResultOut]


class PreflightOut(BaseModel):
    """The preflight results of a job, per attempt and task; empty when no check ran."""

    job_id: str
    attempts: list[PreflightAttemptOut]


# --- stack dumps (issue 11) ---


class StackThreadOut(BaseModel):
    """One thread of a dump: its title as the tool printed it and its frames, innermost first."""

    title: str
    frames: list[str]
    in_collective: bool = Field(description="this thread waits inside a TensorFlow collective")


class TaskStacksOut(BaseModel):
    """The stacks of one task, as its agent took them (or why there are none)."""

    task_index: int
    task_id: str
    agent_id: str
    agent_name: str
    pid: int | None
    method: str = Field(description='"py-spy" or "faulthandler"; empty when no dump was taken')
    answered: bool = Field(description="false while (or when) the agent has not answered")
    error: str = Field(description="why there is no dump: the agent's reason, or no answer")
    in_collective: bool | None = Field(
        description="some thread waits inside a TensorFlow collective in some snapshot (false only when "
        "outside one in every snapshot); null when there is no dump"
    )
    snapshots: int = Field(
        0, description="how many snapshots of the stacks the dump holds (taken ~0.5 s apart)"
    )
    snapshots_in_collective: int = Field(
        0, description="in how many of them some thread waits inside a TensorFlow collective"
    )
    received_at: datetime
    threads: list[StackThreadOut] = Field(
        description="the threads of one snapshot: the newest that agrees with in_collective"
    )
    text: str = Field(description="the dump as the tool printed it, every snapshot, at most 256 KiB")


class StackDumpsOut(BaseModel):
    """One collection of the stacks of every running task of an attempt, taken at the same moment."""

    id: str
    job_id: str
    attempt: int
    cause: str = Field(description='"request" (a user asked) or "hang" (hang detection)')
    requested_by: str
    requested_at: datetime
    complete: bool = Field(description="every task asked has answered")
    tasks: list[TaskStacksOut]


# --- end of stack dumps ---


# --- sharing a cluster (issue 18): the queue, teams and quotas, cordons and drains ---

MAX_CORDON_REASON_CHARS = 500
MAX_DRAIN_GRACE_SECONDS = MAX_GRACE_SECONDS
MAX_QUOTA_DEVICES = 1_000_000


CordonReason = Annotated[
    str,
    Field(
        max_length=MAX_CORDON_REASON_CHARS,
        json_schema_extra={"pattern": PRINTABLE_PATTERN},
        description="why, for whoever looks at `mwms agents`",
    ),
    matching(PRINTABLE_PATTERN, "printable: no newlines, control characters or emoji"),
]


class QueueEntry(BaseModel):
    """One waiting job in the scheduler's order (server/services/queue_view.py QueueRow)."""

    position: int = Field(description="1-based place in the order the scheduler places jobs in")
    job_id: str
    name: str
    state: str = Field(description="PENDING, RESTARTING or PREEMPTING")
    team: str
    submitted_by: str
    priority: int
    workers: int
    gpus_per_worker: int
    memory_per_worker: int | None = Field(default=None, description="bytes per worker; null: none asked")
    preemptible: bool
    created_at: datetime
    waiting: dict[str, Any] = Field(
        description="why it waits: kind, message, estimated_start (ISO time or null) and the kind's details"
    )
    estimated_start: datetime | None = Field(
        default=None,
        description="when it is estimated to start, for people (server/services/start_estimates.py): from "
        "running jobs' max_runtime, else from how long their users' jobs of the same shape usually run; "
        "null: unknown. waiting.estimated_start is the scheduler's own reservation (max_runtime only)",
    )
    estimate_basis: Literal["max_runtime", "similar_jobs", "overdue", "unknown"] = Field(
        default="unknown",
        description="what estimated_start rests on: max_runtime (every end it waits for is a max_runtime), "
        "similar_jobs (some come from the typical run time of the same user's jobs of that shape), overdue "
        "(running jobs have run past that typical time and may end any moment: it may start any time now), "
        "unknown (nothing to go on)",
    )


class QueuePage(BaseModel):
    """What `GET /api/v1/queue` answers: one page of the waiting jobs, in order."""

    jobs: list[QueueEntry]
    total: int = Field(description="waiting jobs in all")
    offset: int
    limit: int


class DeviceCounts(BaseModel):
    gpus: int | None = Field(default=None, description="GPUs; null in a quota: no cap")
    cpu_slots: int | None = Field(default=None, description="CPU slots; null in a quota: no cap")


class DeviceAmounts(BaseModel):
    gpus: float = Field(description="of GPUs")
    cpu_slots: float = Field(description="of CPU slots")


class TeamOut(BaseModel):
    """A team: its members, its quota (null: none), the devices its jobs hold now, and its fair share over time:
    within a priority band the team with the lowest standing plus dominant share now (in_use over share, the
    larger of the two kinds) goes first."""

    team: str
    members: list[str]
    quota: DeviceCounts | None
    in_use: DeviceCounts
    usage_device_hours: DeviceAmounts = Field(
        description="device-hours its jobs held, each hour decayed with MWMS_FAIR_SHARE_HALF_LIFE_HOURS "
        "(one half-life ago counts half)"
    )
    share: DeviceAmounts = Field(
        description="its share: its quota, else an even part of the online devices among the teams that run "
        "or wait (itself included)"
    )
    standing: float = Field(
        ge=0,
        description="its decayed usage over its share, in hours of its whole share (the larger of the two "
        "kinds); 0: no usage on record",
    )


QuotaCount = Annotated[int, Field(ge=0, le=MAX_QUOTA_DEVICES), Strict(), WHOLE_FLOATS_AS_INT]


class QuotaIn(BaseModel):
    """What `PUT /api/v1/teams/{team}/quota` takes; null (or leaving a kind out) sets no cap for it."""

    model_config = ConfigDict(extra="forbid")

    gpus: QuotaCount | None = None
    cpu_slots: QuotaCount | None = None


class TeamMemberOut(BaseModel):
    team: str
    user: str
    added_by: str
    added_at: datetime


class CordonIn(BaseModel):
    """What `POST /api/v1/agents/{agent}/cordon` takes."""

    model_config = ConfigDict(extra="forbid")

    reason: CordonReason = ""


class DrainIn(BaseModel):
    """What `POST /api/v1/agents/{agent}/drain` takes."""

    model_config = ConfigDict(extra="forbid")

    reason: CordonReason = ""
    grace_seconds: GraceSeconds | None = Field(
        default=None,
        description="SIGTERM-to-SIGKILL grace for the preempted jobs; default: each job's "
        "preemption_grace_seconds, else MWMS_PREEMPTION_GRACE_S; at most MWMS_MAX_PREEMPTION_GRACE_S",
    )
    let_finish: StrictBool = Field(
        default=False, description="true: preempt nothing, let the jobs it runs finish; only cordon it"
    )


# --- end of sharing ---


class ReplicaOut(BaseModel):
    """One coordinator process on the database (GET /api/v1/replicas)."""

    id: str = Field(description="new at every start of the process")
    name: str
    http_address: str = Field(
        description="HOST:PORT of its HTTP server (for an agents-only one: /healthz and /metrics)"
    )
    grpc_address: str = Field(description="HOST:PORT of its gRPC for agents; empty for an API-only replica")
    version: str
    serve: str = Field(description="api, agents or both")
    pid: int
    started_at: datetime
    seen_at: datetime = Field(description="its last beat (about every second)")
    stopped_at: datetime | None = Field(description="set by a clean stop")
    alive: bool = Field(description="seen within the last 10 s and not stopped")
    agents_held: int = Field(description="agent streams it holds")
    loops: list[str] = Field(description="background loops it leads (holds the lock of)")

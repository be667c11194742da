"""What `POST /api/v1/jobs` takes (JobCreate) and what changes a job's priority (PriorityChange)."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from mwms import task_environment
from mwms.priorities import DEFAULT_PRIORITY
from mwms.server.limits import MAX_WORKERS
from mwms.server.schema_types import PROGRAM_WORD_PATTERN, Integer, StrictBool
from mwms.server.schemas.common import SETTING_LIMIT, GraceSeconds
from mwms.server.schemas.job_parts import (
    CommunicationOptions,
    CpusPerWorker,
    EnvironmentIn,
    HangTimeout,
    MemoryPerWorker,
    Name,
    Priority,
    RestartPolicy,
    Text,
    Timeout,
)

DIGEST_PATTERN = r"^[0-9a-f]{64}$"
ENV_NAME_PATTERN = r"^[^=\u0000]+$"
# Names the agent sets or the spec derives (mwms/task_environment.py).
_REFUSED_ENV_NAMES: list[JsonValue] = [
    name for name in sorted(task_environment.RESERVED_ENV | task_environment.SPEC_ENV.keys())
]
_ENV_NAME = re.compile(ENV_NAME_PATTERN)


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

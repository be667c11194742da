"""The parts of a job's spec (JobCreate, jobs.py): the field types with their bounds and validators,
communication options, restart policy, priority, and the job's own Python environment."""

from __future__ import annotations

import math
import re
from enum import Enum
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    WithJsonSchema,
)

from mwms import environment_lock
from mwms.priorities import MAX_PRIORITY, PRIORITY_NAMES
from mwms.server.limits import (
    INT64_MAX,
    MAX_CPUS_PER_WORKER,
    MAX_MEMORY_PER_WORKER,
    MAX_NAME_CHARS,
    MIN_MEMORY_PER_WORKER,
)
from mwms.server.schema_types import NO_NUL_PATTERN, WHOLE_FLOATS_AS_INT, Integer, pattern_in_schema
from mwms.server.schemas.common import SETTING_LIMIT
from mwms.sizes import format_size


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

"""Request limits: the bounds requests are held to, the errors that name them, and what they guarantee.

The configurable limits are Settings fields (MWMS_* variables, defaults in server/settings.py); the fixed
ones are constants here. Every refusal names the limit and the variable that changes it. The limits on a
job's env and command also guarantee that the StartTask message carrying them fits the agents' gRPC
receive limit (`start_task_bound`), and the settings refuse values that would break that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

# Re-exported: the settings check start_task_bound against the agents' receive limit.
from mwms.agent_link import AGENT_RECEIVE_LIMIT_BYTES as AGENT_RECEIVE_LIMIT_BYTES
from mwms.metrics_line import MAX_NAME_LENGTH
from mwms.server.errors import DomainError

if TYPE_CHECKING:
    from mwms.server.schemas import JobCreate

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
# Workers of one job, and characters of a name: a job's, an agent's, a metric's (the columns hold 200).
MAX_WORKERS = 4096
MAX_NAME_CHARS = MAX_NAME_LENGTH
# Linux's MAX_ARG_STRLEN: one program argument, or one NAME=value string, including its NUL.
ARG_STRLEN_MAX = 128 * 1024
# The longest worker address in a TF_CONFIG: an advertise address (255 characters) and ":65535".
MAX_WORKER_ADDRESS_CHARS = 255 + 6
# A job's memory per worker (its tasks' cgroup limit): below 64 MiB no Python with TensorFlow starts; 64 TiB
# is more than any machine holds. CPUs per worker (the tasks' cgroup cpu.max): more than 0, at most 1024.
MIN_MEMORY_PER_WORKER = 64 * 2**20
MAX_MEMORY_PER_WORKER = 64 * 2**40
MAX_CPUS_PER_WORKER = 1024
# StartTask fields other than command, env and tf_config: ids, digest, device indices, the checkpoint
# directory and the communication variables the coordinator adds to env. Generous on purpose.
START_TASK_FIXED_BYTES = 64 * 1024


class LimitExceeded(DomainError):
    """A field over its bound (HTTP 422); `loc` is the field's path in the request, as in pydantic errors."""

    def __init__(self, message: str, loc: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.loc = loc


class TooManyRequests(DomainError):
    """More concurrent requests of a kind than a limit allows (HTTP 429)."""


class SpecLimitSettings(Protocol):
    """The Settings fields the job spec is checked against."""

    max_env_vars: int
    max_env_name_bytes: int
    max_env_value_bytes: int
    max_env_total_bytes: int
    max_command_args: int
    max_command_bytes: int
    max_timeout_seconds: float


@dataclass(frozen=True)
class SpecLimits:
    env_vars: int
    env_name_bytes: int
    env_value_bytes: int
    env_total_bytes: int
    command_args: int
    command_bytes: int
    timeout_seconds: float

    @classmethod
    def of(cls, settings: SpecLimitSettings) -> SpecLimits:
        return cls(
            env_vars=settings.max_env_vars,
            env_name_bytes=settings.max_env_name_bytes,
            env_value_bytes=settings.max_env_value_bytes,
            env_total_bytes=settings.max_env_total_bytes,
            command_args=settings.max_command_args,
            command_bytes=settings.max_command_bytes,
            timeout_seconds=settings.max_timeout_seconds,
        )


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _duration(seconds: float) -> str:
    if seconds >= 86400 and seconds % 86400 == 0:
        return f"{seconds / 86400:g} days"
    return f"{seconds:g} s"


def check_job_spec(spec: JobCreate, limits: SpecLimits) -> None:
    """LimitExceeded naming the first limit the spec is over (and its MWMS_* variable), else nothing."""
    if len(spec.command) > limits.command_args:
        raise LimitExceeded(
            f"command has {len(spec.command)} arguments; at most {limits.command_args} are allowed "
            "(MWMS_MAX_COMMAND_ARGS): pass long lists in a file in the bundle",
            ("body", "command"),
        )
    for position, argument in enumerate(spec.command):
        if _size(argument) >= ARG_STRLEN_MAX:
            raise LimitExceeded(
                f"command[{position}] is {_size(argument)} bytes; Linux runs no program with an argument "
                f"of {ARG_STRLEN_MAX} bytes or more: put the data in a file in the bundle",
                ("body", "command", position),
            )
    command_bytes = sum(_size(a) for a in spec.command)
    if command_bytes > limits.command_bytes:
        raise LimitExceeded(
            f"command is {command_bytes} bytes; at most {limits.command_bytes} are allowed "
            "(MWMS_MAX_COMMAND_BYTES): put long arguments in a file in the bundle",
            ("body", "command"),
        )
    if len(spec.env) > limits.env_vars:
        raise LimitExceeded(
            f"env has {len(spec.env)} variables; at most {limits.env_vars} are allowed (MWMS_MAX_ENV_VARS): "
            "put configuration in a file in the bundle",
            ("body", "env"),
        )
    total = 0
    for name, value in spec.env.items():
        if _size(name) > limits.env_name_bytes:
            raise LimitExceeded(
                f"env name {name[:40]!r}... is {_size(name)} bytes; at most {limits.env_name_bytes} are "
                "allowed (MWMS_MAX_ENV_NAME_BYTES)",
                ("body", "env", name[:40]),
            )
        if _size(value) > limits.env_value_bytes:
            raise LimitExceeded(
                f"env {name} is {_size(value)} bytes; at most {limits.env_value_bytes} are allowed "
                "(MWMS_MAX_ENV_VALUE_BYTES): put large values in a file in the bundle",
                ("body", "env", name),
            )
        total += _size(name) + _size(value)
    if total > limits.env_total_bytes:
        raise LimitExceeded(
            f"env holds {total} bytes of names and values; at most {limits.env_total_bytes} are allowed "
            "(MWMS_MAX_ENV_TOTAL_BYTES): put configuration in a file in the bundle",
            ("body", "env"),
        )
    timeouts: list[tuple[tuple[str | int, ...], float | None]] = [
        (("body", "startup_timeout_seconds"), spec.startup_timeout_seconds),
        (("body", "max_runtime_seconds"), spec.max_runtime_seconds),
        (("body", "communication", "timeout_seconds"), spec.communication.timeout_seconds),
    ]
    for loc, seconds in timeouts:
        if seconds is not None and not (math.isfinite(seconds) and seconds <= limits.timeout_seconds):
            name = ".".join(str(part) for part in loc[1:])
            raise LimitExceeded(
                f"{name} is {seconds:g} s; a timeout may be at most {limits.timeout_seconds:.0f} s "
                f"({_duration(limits.timeout_seconds)}, MWMS_MAX_TIMEOUT_SECONDS): give a shorter one, or "
                "leave it out",
                loc,
            )


def _varint_size(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def _field_size(payload: int) -> int:
    """Bytes of one length-delimited protobuf field (tag < 16) carrying `payload` bytes."""
    return 1 + _varint_size(payload) + payload


def start_task_bound(limits: SpecLimits) -> int:
    """The most bytes a StartTask (in its CoordinatorMessage) can take for a spec within `limits`.

    Each env entry and argument costs its bytes plus protobuf framing; the framing is largest when the
    bytes are spread over as many entries as allowed. TF_CONFIG is largest with MAX_WORKERS workers at
    the longest addresses.
    """
    entries = max(1, limits.env_vars)
    per_entry_framing = 2 * (1 + _varint_size(max(limits.env_name_bytes, limits.env_value_bytes)))
    env = entries * (1 + _varint_size(limits.env_total_bytes) + per_entry_framing) + limits.env_total_bytes
    args = max(1, limits.command_args)
    command = args * (1 + _varint_size(limits.command_bytes)) + limits.command_bytes
    address = MAX_WORKER_ADDRESS_CHARS + len('"", ')
    tf_config = _field_size(MAX_WORKERS * address + 200)
    start = env + command + tf_config + START_TASK_FIXED_BYTES
    return _field_size(start)


# --- connection limits (issue 16): what one HTTP or gRPC connection is held to ---

# gRPC request metadata (headers) of one call, in bytes: gRPC core refuses some calls over the soft bound
# and every call over the hard one. An agent sends well under 1 KiB (its credential and gRPC's own).
GRPC_MAX_METADATA_BYTES = 8 * 1024
GRPC_ABSOLUTE_MAX_METADATA_BYTES = 16 * 1024
# A gRPC connection with no call open for this long is closed (GOAWAY); agents keep their Connect stream
# open, so only connections that are not agents' (or agents between streams) are ever idle that long.
GRPC_MAX_CONNECTION_IDLE_MS = 5 * 60 * 1000
# A gRPC connection must finish its TLS handshake and HTTP/2 preface within this (gRPC's default: 120 s).
GRPC_HANDSHAKE_TIMEOUT_MS = 20_000


class HttpBoundSettings(Protocol):
    """The Settings fields HTTP connections are held to."""

    max_request_head_bytes: int
    http_head_timeout_s: float
    http_body_idle_timeout_s: float


@dataclass(frozen=True)
class HttpBounds:
    """What one HTTP connection is held to (server/http_protocol.py)."""

    max_head_bytes: int
    head_timeout_s: float
    body_idle_timeout_s: float

    @classmethod
    def of(cls, settings: HttpBoundSettings) -> HttpBounds:
        return cls(
            max_head_bytes=settings.max_request_head_bytes,
            head_timeout_s=settings.http_head_timeout_s,
            body_idle_timeout_s=settings.http_body_idle_timeout_s,
        )


def head_too_large_message(limit: int) -> str:
    """What a client whose request line and headers are over the limit is told (HTTP 431)."""
    return (
        f"the request line and headers are over {limit} bytes ({limit / 1024:g} KiB), the limit for a "
        "request head (MWMS_MAX_REQUEST_HEAD_BYTES): send shorter headers, cookies and query strings, "
        "and put data in the request body"
    )


def head_timeout_message(seconds: float) -> str:
    """What a client that took too long to send its request line and headers is told (HTTP 408)."""
    return (
        f"the request line and headers did not arrive within {seconds:g} s (MWMS_HTTP_HEAD_TIMEOUT_S): "
        "send each request's line and headers at once"
    )


# A multipart bundle upload (POST /api/v1/bundles): at most this many parts (the archive is the one that
# counts; clients may add a few fields), each with at most this many bytes of part headers.
MAX_MULTIPART_PARTS = 16
MAX_PART_HEADER_BYTES = 8 * 1024

# Threads of the coordinator's default executor (server/app.py): most wait on the database or the writer
# lock, so more of them cost memory, not CPU; the database pool still bounds the connections they use.
BLOCKING_THREADS = 32

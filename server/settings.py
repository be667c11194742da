"""Coordinator settings: one pydantic-settings class, environment prefix MWMS_, passed in explicitly.

`mwms server` hands its options to `settings_from_options`, which lays them over the MWMS_* variables and
the defaults here and says, for any value that cannot be used, which flag or variable to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from mwms.archive import DEFAULT_LIMITS, ArchiveLimits
from mwms.log_setup import DEFAULT_FORMAT, DEFAULT_LEVEL, parse_format, parse_level
from mwms.loopback import is_loopback
from mwms.server.limits import AGENT_RECEIVE_LIMIT_BYTES, ARG_STRLEN_MAX, SpecLimits, start_task_bound


class Settings(BaseSettings):
    """Everything the coordinator can be told: the defaults live here, MWMS_* variables override them,
    and the CLI passes only the flags a user gave, which override both."""

    model_config = SettingsConfigDict(env_prefix="MWMS_")

    http_host: str = "127.0.0.1"
    grpc_host: str = "127.0.0.1"
    http_port: int = Field(default=8080, ge=0, le=65535)
    grpc_port: int = Field(default=50051, ge=0, le=65535)
    # Once both listen, {"http": N, "grpc": M} is written here (atomically): the ports bound, which is how
    # whoever started the coordinator with port 0 learns them.
    ports_file: Path | None = None
    data_dir: Path = Path("mwms-data")
    # How the coordinator logs to stderr (mwms/log_setup.py): "text" or "json" lines, at this level or above.
    log_format: Annotated[str, AfterValidator(parse_format)] = DEFAULT_FORMAT
    log_level: Annotated[str, AfterValidator(parse_level)] = DEFAULT_LEVEL
    # Replicas (several coordinators on one PostgreSQL database): what this one serves ("api": REST and
    # the dashboard; "agents": the agents' gRPC, with /healthz and /metrics; "both"), the name it is
    # listed under (default: host:pid) and the host others reach it by (default: the bound host).
    serve: Literal["api", "agents", "both"] = "both"
    replica_name: str = Field(default="", max_length=200)
    replica_address: str = Field(default="", max_length=255)
    db_url: str | None = Field(default=None, description="SQLAlchemy URL; default: SQLite in data_dir")
    # A bootstrap join token: agents presenting it may join (admins can also make revocable ones).
    join_token: SecretStr = SecretStr("")
    # Made an admin API token at start instead of generating one (for scripted set-ups).
    admin_token: SecretStr = SecretStr("")
    # Host headers the HTTP API answers (DNS rebinding); empty: loopback names when bound to loopback,
    # any otherwise. Comma-separated in MWMS_ALLOWED_HOSTS.
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # TLS for REST and gRPC (grpc_tls_* when gRPC uses another certificate).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    grpc_tls_cert: Path | None = None
    grpc_tls_key: Path | None = None
    # Make a CA and a server certificate in data_dir/tls and serve both protocols with them.
    tls_self_signed: bool = False
    # gRPC server reflection (grpcurl lists the agents' service and grpc.health.v1, which is always on).
    grpc_reflection: bool = True
    heartbeat_interval_s: float = 2.0
    # An agent that has not been heard from for this long is lost; its attempts end.
    agent_timeout_s: float = 10.0
    # After a coordinator start, or the death of the replica holding their streams, agents get this long
    # plus agent_timeout_s to reconnect before they count as lost (reconnect_window_s).
    reconnect_grace_s: float = 20.0
    scheduler_interval_s: float = 0.5
    # While passes find nothing to place or preempt, timed passes (those no event asked for) run at most
    # this often; a submit, an ended task or a joining agent still starts one at once.
    scheduler_idle_interval_s: float = Field(default=2.0, ge=0, le=60, allow_inf_nan=False)
    # Scheduler passes run in a process of their own (server/live/scheduler_worker.py), so a pass over
    # thousands of waiting jobs never holds the interpreter that answers heartbeats and REST calls.
    # False: in a thread of the coordinator's process (an in-memory SQLite database always does).
    scheduler_process: bool = True
    # Log lines and metric points are decoded and stored in a process of their own (server/ingest_worker.py),
    # so 100,000 items a second never hold the interpreter that answers heartbeats and REST calls.
    # False: in a thread of the coordinator's process (an in-memory SQLite database always does).
    ingest_process: bool = True
    # The polled lists (agents, jobs, overview, queue) are built once for every caller within this many
    # seconds (server/api/view_cache.py); a write answered by this replica shows at once, what agents,
    # loops and other replicas change within this time. 0: built for each request. Default: 1 on an
    # API-only replica (whose agents' news comes from other replicas' flushes each second anyway), else 0.
    view_cache_s: float | None = Field(default=None, ge=0, le=10, allow_inf_nan=False)
    # Grace between SIGTERM and SIGKILL when a task is stopped (cancel, restart, a failed peer) and its job
    # set no preemption_grace_seconds: short, so a stop is prompt although TensorFlow catches SIGTERM.
    stop_grace_s: int = 1
    # Backoff before a failed attempt is placed again (doubles per restart, capped at 60 s).
    restart_backoff_s: float = 2.0
    # Default for jobs that do not set startup_timeout_s.
    startup_timeout_s: float = 300.0
    # Default for jobs that do not set hang_timeout_seconds; 0: no hang detection unless a job asks for it.
    hang_timeout_s: float = Field(default=0.0, ge=0, le=30 * 24 * 3600, allow_inf_nan=False)
    # Default for jobs that do not set preflight: run the gang's preflight check before the program.
    preflight: bool = False
    # Seconds an agent lets a task's preflight check run before it kills it and fails the task.
    preflight_timeout_s: int = Field(default=120, ge=10, le=3600)
    # False: the check that `preflight` above adds stops after reachability (MWMS_PREFLIGHT_ALLREDUCE=0 unless a
    # job's env says otherwise), about 0.4 s instead of 3 s; jobs that ask for the check get all of it.
    preflight_allreduce: bool = True
    # A shared filesystem path for checkpoints; empty: agents ship checkpoints through the coordinator.
    shared_checkpoint_dir: str = ""

    # --- archive and upload limits (issue 9) ---
    # Defaults live in mwms/archive.py (ArchiveLimits), which agents use as they are.
    # Bundle uploads (POST /api/v1/bundles) and agent uploads (artifacts, checkpoints) above this are refused.
    max_upload_bytes: int = Field(default=DEFAULT_LIMITS.max_archive_bytes, ge=1)
    archive_max_entries: int = Field(default=DEFAULT_LIMITS.max_entries, ge=1)
    archive_max_unpacked_bytes: int = Field(default=DEFAULT_LIMITS.max_unpacked_bytes, ge=1)
    archive_max_ratio: float = Field(default=DEFAULT_LIMITS.max_ratio, gt=1, allow_inf_nan=False)
    archive_time_budget_s: float = Field(default=DEFAULT_LIMITS.time_budget_s, gt=0, allow_inf_nan=False)
    # Threads of their own that write uploads and check archives, apart from the ones heartbeats use.
    archive_workers: int = Field(default=2, ge=1, le=64)

    @property
    def archive_limits(self) -> ArchiveLimits:
        """The coordinator's archive limits: the shared defaults, as overridden by these settings."""
        return ArchiveLimits(
            max_archive_bytes=self.max_upload_bytes,
            max_entries=self.archive_max_entries,
            max_unpacked_bytes=self.archive_max_unpacked_bytes,
            max_ratio=self.archive_max_ratio,
            time_budget_s=self.archive_time_budget_s,
        )

    # --- end of archive and upload limits ---

    # --- request limits (issue 9) ---
    # Every request body but bundle uploads (a job spec, a token request): refused with 413 before it is
    # read when its Content-Length says more, and cut off at the limit when it has none.
    max_request_body_bytes: int = Field(default=1024 * 1024, ge=4096, le=64 * 1024 * 1024)
    # A job's env: variables, bytes of one name, of one value, and of all names and values together.
    max_env_vars: int = Field(default=1000, ge=0, le=100_000)
    max_env_name_bytes: int = Field(default=256, ge=1, le=4096)
    max_env_value_bytes: int = Field(default=64 * 1024, ge=0, le=ARG_STRLEN_MAX - 4096 - 2)
    max_env_total_bytes: int = Field(default=256 * 1024, ge=0)
    # A job's command: arguments, and bytes of all of them together.
    max_command_args: int = Field(default=1000, ge=1, le=100_000)
    max_command_bytes: int = Field(default=256 * 1024, ge=1)
    # Every timeout in a job spec (startup, runtime, collectives); finite, so deadlines never overflow.
    max_timeout_seconds: float = Field(default=30 * 86400, gt=0, le=3650 * 86400)
    # Log follows (GET /api/v1/jobs/{id}/logs?follow=true) open at once, per user and in all; a follow
    # that has sent no line for follow_idle_timeout_s ends (clients follow again from their cursor).
    max_follows_per_user: int = Field(default=8, ge=1, le=10_000)
    max_follows_total: int = Field(default=200, ge=1, le=100_000)
    follow_idle_timeout_s: float = Field(default=600.0, gt=0, le=86400)

    @model_validator(mode="after")
    def _start_task_fits(self) -> Settings:
        bound = start_task_bound(SpecLimits.of(self))
        if bound > AGENT_RECEIVE_LIMIT_BYTES:
            raise ValueError(
                f"with these MWMS_MAX_ENV_* and MWMS_MAX_COMMAND_* limits a task's StartTask message may take "
                f"{bound} bytes, over the agents' gRPC receive limit of {AGENT_RECEIVE_LIMIT_BYTES}: lower "
                "MWMS_MAX_ENV_TOTAL_BYTES, MWMS_MAX_COMMAND_BYTES, MWMS_MAX_ENV_VARS or MWMS_MAX_COMMAND_ARGS"
            )
        return self

    # --- end of request limits ---

    # --- sharing a cluster (issue 18): priorities, preemption ---
    # The highest priority (0-1000) a user may give a job; admins may give any. Jobs default to 500.
    user_priority_ceiling: int = Field(default=500, ge=0, le=1000)
    # SIGTERM-to-SIGKILL grace for a preempted or drained job that does not set preemption_grace_seconds,
    # and the most a job may ask for.
    preemption_grace_s: int = Field(default=30, ge=0, le=3600)
    max_preemption_grace_s: int = Field(default=600, ge=0, le=3600)
    # A job runs at least this long before it may be preempted, and is preempted at most this many times
    # an hour (0: never preempted).
    preemption_min_runtime_s: float = Field(default=60.0, ge=0, le=86400, allow_inf_nan=False)
    max_preemptions_per_hour: int = Field(default=4, ge=0, le=100)
    # False: only admins may submit a job with preemptible=false.
    users_may_opt_out_of_preemption: bool = True
    # Fair share over time (server/services/scheduler/fair_share.py): a team's past device use counts half after this
    # many hours, a quarter after twice as many (Slurm's PriorityDecayHalfLife is 7 days too). From 6
    # minutes to 10 years.
    fair_share_half_life_hours: float = Field(default=168.0, ge=0.1, le=87600, allow_inf_nan=False)
    # --- end of sharing ---

    # --- connection limits (issue 16) ---
    # An HTTP request's line and headers together: past this the connection gets 431 and is closed, before
    # the coordinator reads more of it (server/http_protocol.py).
    max_request_head_bytes: int = Field(default=64 * 1024, ge=8 * 1024, le=1024 * 1024)
    # Seconds an HTTP connection may take to send a request's line and headers, counted from when it opened
    # or was last answered (slowloris: a byte every few seconds). A connection that sends nothing is closed
    # after http_keep_alive_s (idle keep-alive), one whose request body stops arriving (while the
    # coordinator waits for it) after http_body_idle_timeout_s.
    http_head_timeout_s: float = Field(default=10.0, gt=0, le=600, allow_inf_nan=False)
    http_keep_alive_s: int = Field(default=5, ge=1, le=600)
    http_body_idle_timeout_s: float = Field(default=30.0, gt=0, le=3600, allow_inf_nan=False)
    # --- end of connection limits ---

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @property
    def trusted_hosts(self) -> list[str]:
        """The Host header values the HTTP API answers."""
        if self.allowed_hosts:
            return self.allowed_hosts
        if is_loopback(self.http_host):
            return ["127.0.0.1", "localhost", "[::1]", "::1"]
        return ["*"]

    @property
    def reconnect_window_s(self) -> float:
        """How long an agent whose coordinator (or stream replica) went away may take to say hello again
        before it counts as lost. Its own reconnect backs off up to 3 s (worker_agent/main.py), but a
        registration may meet a replica that is starting, or swamped by the same failover, and wait its
        10 s timeout before the agent moves on to the next: a kill storm's agents needed 19-23 s."""
        return self.agent_timeout_s + self.reconnect_grace_s

    @property
    def view_cache_seconds(self) -> float:
        """How long a polled list's answer is served again (view_cache_s, else the role's default)."""
        if self.view_cache_s is not None:
            return self.view_cache_s
        return 1.0 if self.serve == "api" else 0.0

    @property
    def serves_tls(self) -> bool:
        """True when the HTTP API is served over TLS."""
        return self.tls_self_signed or self.tls_cert is not None

    @property
    def admin_token_file(self) -> Path:
        return self.data_dir / "admin-token"

    @property
    def database_url(self) -> str:
        """The SQLAlchemy URL in force."""
        if self.db_url:
            return self.db_url
        return f"sqlite:///{(self.data_dir / 'mwms.db').resolve()}"

    @property
    def bundle_dir(self) -> Path:
        return self.data_dir / "bundles"

    @property
    def files_dir(self) -> Path:
        return self.data_dir / "files"

    # --- retention (issue 10) ---
    # Log lines and metric points of jobs that finished more than this many days ago are deleted by a
    # background loop in small batches (the jobs themselves are kept); 0 keeps them forever.
    telemetry_retention_days: float = Field(default=30.0, ge=0, le=36500, allow_inf_nan=False)
    # How often the retention loop looks for telemetry to delete.
    retention_interval_s: float = Field(default=300.0, gt=0, le=86400, allow_inf_nan=False)
    # --- end of retention ---

    # --- device telemetry (issue 11) ---
    # GPU samples (utilisation, memory, temperature) older than this many hours are deleted (never kept
    # longer than telemetry_retention_days); 0: only telemetry_retention_days applies.
    device_sample_retention_hours: float = Field(default=24.0, ge=0, le=36500 * 24, allow_inf_nan=False)
    # --- end of device telemetry ---


# --- from `mwms server`'s options ---


class SettingsError(ValueError):
    """Settings that cannot be used; the message names each bad setting's flag or MWMS_* variable, what it
    must be and what it was (the CLI prints it as it is)."""


# The flags of settings whose flag is not --<field name> (with dashes).
_FLAGS = {"hang_timeout_s": "--hang-timeout"}


def validated_settings(given: Mapping[str, object], settings_class: type[Settings] = Settings) -> Settings:
    """Settings from `given` (the flags' values by field name, which override the MWMS_* variables, which
    override the defaults); SettingsError naming the flag (when given) or variable of every bad value."""
    try:
        return settings_class.model_validate(dict(given))
    except ValidationError as error:
        problems = []
        for item in error.errors():
            name = ".".join(str(part) for part in item["loc"]) or "settings"
            if name in given:
                where = _FLAGS.get(name, f"--{name.replace('_', '-')}")
            else:
                where = f"MWMS_{name.upper()}"
            problems.append(f"{where}: {item['msg']} (got {item.get('input')!r})")
        raise SettingsError("invalid coordinator setting: " + "; ".join(problems)) from None


def settings_from_options(
    *,
    host: str | None = None,
    http_host: str | None = None,
    grpc_host: str | None = None,
    http_port: int | None = None,
    grpc_port: int | None = None,
    data_dir: Path | None = None,
    db_url: str | None = None,
    serve: str | None = None,
    replica_name: str | None = None,
    replica_address: str | None = None,
    join_token: str | None = None,
    allowed_hosts: str | None = None,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    grpc_tls_cert: Path | None = None,
    grpc_tls_key: Path | None = None,
    tls_self_signed: bool | None = None,
    grpc_reflection: bool | None = None,
    hang_timeout: float | None = None,
    ports_file: Path | None = None,
    log_format: str | None = None,
    log_level: str | None = None,
) -> Settings:
    """The settings `mwms server` runs with: each option given (None: not given) overrides its MWMS_*
    variable, which overrides the default; `host` is both hosts, unless --http-host / --grpc-host say
    otherwise. SettingsError for any value that cannot be used."""
    given: dict[str, object] = {
        "http_host": http_host or host,
        "grpc_host": grpc_host or host,
        "http_port": http_port,
        "grpc_port": grpc_port,
        "data_dir": data_dir,
        "db_url": db_url,
        "serve": serve,
        "replica_name": replica_name,
        "replica_address": replica_address,
        "join_token": join_token,
        "allowed_hosts": allowed_hosts,
        "tls_cert": tls_cert,
        "tls_key": tls_key,
        "grpc_tls_cert": grpc_tls_cert,
        "grpc_tls_key": grpc_tls_key,
        "tls_self_signed": tls_self_signed,
        "grpc_reflection": grpc_reflection,
        "hang_timeout_s": hang_timeout,
        "ports_file": ports_file,
        "log_format": log_format,
        "log_level": log_level,
    }
    return validated_settings({name: value for name, value in given.items() if value is not None})

"""What an agent is told at start: where the coordinator is, who it is, where it keeps its files.

The coordinator may run as several replicas on one database; the agent is then given all their gRPC
addresses, comma-separated ("a:50051,b:50051"), and talks to one at a time (worker_agent/channel.py
ServerRotation). `parse_servers` is the one place that says what an address list may hold; the CLI calls
it before starting, so a typo is reported at once instead of as an endless reconnect.

`mwms agent` hands its options over as they were given (`AgentOptions`); `check_agent_options` checks them,
alone and together, and fills in the defaults (`AgentSetup`), from which come both the AgentConfig an agent
runs with and the command line of a systemd unit. Standard library only, like mwms/agent_defaults.py: the
CLI checks options (and prints units) without the agent's extras installed.

The address list is checked in worker_agent/server_addresses.py, the port range against the kernel's
ephemeral range in worker_agent/ephemeral_ports.py.
"""

from __future__ import annotations

import os
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mwms import agent_defaults as defaults
from mwms.log_setup import DEFAULT_FORMAT, DEFAULT_LEVEL, parse_format, parse_level
from mwms.sizes import SizeError, parse_size
from mwms.worker_agent.ephemeral_ports import RESERVED_PORTS_FILE, _parse_port_set, _read_small
from mwms.worker_agent.ephemeral_ports import ephemeral_overlap_warning as ephemeral_overlap_warning
from mwms.worker_agent.ephemeral_ports import ephemeral_range as ephemeral_range
from mwms.worker_agent.server_addresses import local_address_towards as local_address_towards
from mwms.worker_agent.server_addresses import parse_servers as parse_servers


@dataclass(frozen=True)
class AgentConfig:
    """Settings for one agent process; built by `AgentSetup.config` (or a test) and passed to `run_agent`.

    The defaults are mwms/agent_defaults.py's; `mwms agent` passes only the options a user gave."""

    # "host:port" of the coordinator's gRPC endpoint, or several (replicas) separated by commas.
    server: str
    name: str
    work_dir: Path
    slots: int = defaults.SLOTS
    # True when --slots was given: an agent without GPUs then offers CPU slots without a warning.
    slots_given: bool = False
    # Empty: the local IP the OS uses to reach the coordinator (see `local_address_towards`).
    advertise_address: str = ""
    port_low: int = defaults.PORT_LOW
    port_high: int = defaults.PORT_HIGH
    join_token: str = ""
    # Seconds between SIGTERM and SIGKILL when the agent itself shuts its tasks down.
    stop_grace: float = defaults.STOP_GRACE_S
    # TLS to the coordinator: verified against this CA certificate (PEM), or, with `tls`, public CAs.
    ca_file: Path | None = None
    tls: bool = False
    # Seconds between two samples of the GPUs' utilisation, memory and temperature; 0: none.
    device_sample_interval: float = defaults.DEVICE_SAMPLE_INTERVAL_S
    # How tasks are confined (worker_agent/sandbox.py): "auto" (bubblewrap when installed), "bwrap", "off".
    sandbox: str = defaults.SANDBOX
    # Who tasks run as when the agent is root (worker_agent/task_users.py): one user for every task
    # (a name or uid), or else one uid per concurrent task from this inclusive range.
    task_user: str | None = None
    task_uids: tuple[int, int] = (defaults.TASK_UID_LOW, defaults.TASK_UID_HIGH)
    # Jobs' own Python environments, built with uv under <work dir>/envs: the cache's size in bytes
    # (least recently used evicted first, never one in use; 0: unbounded) and one build's time limit.
    env_cache_bytes: int = defaults.ENV_CACHE_BYTES
    # Where they are kept; None: <work dir>/envs. Agents on one machine may share one (builds are locked).
    env_cache_dir: Path | None = None
    env_build_timeout: float = defaults.ENV_BUILD_TIMEOUT_S
    # Whether uv may build a source distribution (its build script, a job's choice, then runs as the agent).
    env_source_builds: bool = False
    # Each task's processes and threads, and the size of its files (0: no limit).
    task_pids_max: int = defaults.TASK_PIDS_MAX
    task_disk_max: int = defaults.TASK_DISK_MAX
    # Warm interpreters the agent keeps (worker_agent/warm_pool.py); 0: none.
    warm_pool: int = defaults.WARM_POOL
    # `server` parsed: the addresses in order (ValueError at construction when one is malformed).
    servers: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "servers", parse_servers(self.server))

    def __repr__(self) -> str:
        # The join token is a secret: keep it out of logs and tracebacks (the credential never is in here).
        return (
            f"AgentConfig(server={self.server!r}, name={self.name!r}, work_dir={str(self.work_dir)!r}, "
            f"slots={self.slots}, advertise_address={self.advertise_address!r}, "
            f"ports={self.port_low}-{self.port_high}, stop_grace={self.stop_grace}, "
            f"ca_file={str(self.ca_file) if self.ca_file else None!r}, tls={self.tls or self.ca_file is not None}, "
            f"sandbox={self.sandbox!r}, task_user={self.task_user!r}, task_uids={self.task_uids})"
        )


def port_range_warning(config: AgentConfig) -> str:
    """`ephemeral_overlap_warning` for this machine's kernel settings (empty off Linux)."""
    try:
        reserved = _parse_port_set(_read_small(RESERVED_PORTS_FILE))
    except OSError:
        reserved = set()
    return ephemeral_overlap_warning(config.port_low, config.port_high, ephemeral_range(), reserved)


# --- from `mwms agent`'s options to an AgentConfig or a unit's command line ---


class AgentOptionError(ValueError):
    """An option of `mwms agent`, or a combination of them, that cannot be used; the message names the
    option and says what to give instead (the CLI prints it as it is)."""


JOIN_TOKEN_ENV = "MWMS_JOIN_TOKEN"
# Never echoes the token: the point is that it must not be seen.
JOIN_TOKEN_FLAG_REFUSED = (
    "--join-token is refused: every user of this machine can read a command line (ps, /proc/PID/cmdline). "
    f"Pass the join token in the {JOIN_TOKEN_ENV} environment variable or in a file only you can read: "
    "--join-token-file PATH (chmod 600 PATH)."
)


@dataclass(frozen=True)
class AgentOptions:
    """`mwms agent`'s options as they were given: None (False for a flag) where one was not, so that the
    default of mwms/agent_defaults.py (AgentConfig's) applies. LO-HI ranges come parsed, as (LO, HI)."""

    server: str | None = None
    name: str | None = None
    work_dir: Path | None = None
    slots: int | None = None
    advertise_address: str | None = None
    port_range: tuple[int, int] | None = None
    # Only ever refused: a token on the command line is seen by every user of the machine.
    join_token: str | None = field(default=None, repr=False)
    join_token_file: Path | None = None
    stop_grace_seconds: float | None = None
    ca_file: Path | None = None
    tls: bool = False
    device_sample_interval: float | None = None
    sandbox: str | None = None
    env_cache_bytes: int | None = None
    env_cache_dir: Path | None = None
    env_build_timeout: float | None = None
    env_source_builds: bool = False
    task_user: str | None = None
    task_uids: tuple[int, int] | None = None
    task_pids_max: int | None = None
    task_disk_max: str | None = None
    warm_pool: int | None = None
    log_format: str | None = None
    log_level: str | None = None


@dataclass(frozen=True)
class AgentSetup:
    """`mwms agent`'s options checked, with the defaults filled in that a unit's command line spells out:
    what both the AgentConfig (`config`) and a systemd unit's ExecStart= (`unit_arguments`) are made from."""

    given: AgentOptions
    servers: tuple[str, ...]
    name: str
    work_dir: Path  # as given, or the default (not expanded)
    ports: tuple[int, int]
    sandbox: str
    task_uids: tuple[int, int]
    task_disk_max: int | None  # bytes; None: not given
    ca_file: Path | None  # resolved, and known to hold a PEM certificate
    stop_grace: float
    log_format: str
    log_level: str

    @property
    def server(self) -> str:
        """The coordinator addresses, comma-separated."""
        return ",".join(self.servers)

    @property
    def unit_work_dir(self) -> str:
        """The work dir as a unit names it: absolute."""
        return str(self.work_dir.expanduser().resolve())

    def unit_arguments(self) -> list[str]:
        """The arguments after `mwms agent` that start an agent with this setup under systemd: the
        defaults spelled out, paths absolute, and never the join token (only --join-token-file)."""
        given = self.given
        slots = defaults.SLOTS if given.slots is None else given.slots
        args = ["--server", self.server, "--name", self.name, "--work-dir", self.unit_work_dir]
        args += ["--slots", str(slots), "--port-range", f"{self.ports[0]}-{self.ports[1]}"]
        if given.advertise_address:
            args += ["--advertise-address", given.advertise_address]
        if given.device_sample_interval is not None:
            args += ["--device-sample-interval", f"{given.device_sample_interval:g}s"]
        args += ["--sandbox", self.sandbox, "--task-uids", f"{self.task_uids[0]}-{self.task_uids[1]}"]
        args += ["--stop-grace-seconds", f"{self.stop_grace:g}"]
        if given.env_cache_bytes is not None:
            args += ["--env-cache-bytes", str(given.env_cache_bytes)]
        if given.env_build_timeout is not None:
            args += ["--env-build-timeout", f"{given.env_build_timeout:g}s"]
        if given.env_cache_dir is not None:
            args += ["--env-cache-dir", str(given.env_cache_dir.expanduser().resolve())]
        if given.env_source_builds:
            args += ["--env-source-builds"]
        if given.task_pids_max is not None:
            args += ["--task-pids-max", str(given.task_pids_max)]
        if self.task_disk_max is not None:
            args += ["--task-disk-max", str(self.task_disk_max)]
        if given.warm_pool is not None:
            args += ["--warm-pool", str(given.warm_pool)]
        if given.log_format is not None:
            args += ["--log-format", self.log_format]
        if given.log_level is not None:
            args += ["--log-level", self.log_level]
        if given.task_user:
            args += ["--task-user", given.task_user]
        if given.join_token_file is not None:  # not read here: it may well be root's alone
            args += ["--join-token-file", str(given.join_token_file.expanduser().resolve())]
        if self.ca_file is not None:
            args += ["--ca-file", str(self.ca_file)]
        elif given.tls:
            args += ["--tls"]
        return args

    def config(self) -> AgentConfig:
        """The AgentConfig to run with: the options given, AgentConfig's defaults for the others. Reads the
        join token (`read_join_token`: MWMS_JOIN_TOKEN, which it takes out of the environment, or
        --join-token-file); AgentOptionError when that cannot be read."""
        given = self.given
        optional: dict[str, Any] = {  # AgentConfig holds the defaults of the options not given
            "slots": given.slots,
            "slots_given": True if given.slots is not None else None,
            "port_low": None if given.port_range is None else self.ports[0],
            "port_high": None if given.port_range is None else self.ports[1],
            "device_sample_interval": given.device_sample_interval,
            "sandbox": None if given.sandbox is None else self.sandbox,
            "task_uids": None if given.task_uids is None else self.task_uids,
            "stop_grace": given.stop_grace_seconds,
            "env_cache_bytes": given.env_cache_bytes,
            "env_build_timeout": given.env_build_timeout,
            "env_source_builds": given.env_source_builds or None,
            "task_pids_max": given.task_pids_max,
            "task_disk_max": self.task_disk_max,
            "warm_pool": given.warm_pool,
            "env_cache_dir": None
            if given.env_cache_dir is None
            else given.env_cache_dir.expanduser().resolve(),
        }
        return AgentConfig(
            server=self.server,
            name=self.name,
            work_dir=self.work_dir.expanduser(),
            advertise_address=given.advertise_address or local_address_towards(self.servers[0]),
            join_token=read_join_token(given.join_token_file),
            ca_file=self.ca_file,
            tls=given.tls,
            task_user=given.task_user or None,
            **{name: value for name, value in optional.items() if value is not None},
        )


def check_agent_options(options: AgentOptions, *, for_unit: bool = False) -> AgentSetup:
    """`options` checked, alone and together, with their defaults; AgentOptionError at the first that
    cannot be used. `for_unit`: for a systemd unit, whose work dir defaults to its StateDirectory=, never
    the caller's home. Reads nothing secret: the join token is read by `AgentSetup.config`."""
    if options.join_token is not None:
        raise AgentOptionError(JOIN_TOKEN_FLAG_REFUSED)
    try:
        log_format = parse_format(options.log_format or DEFAULT_FORMAT)
        log_level = parse_level(options.log_level or DEFAULT_LEVEL)
    except ValueError as error:
        raise AgentOptionError(
            f"{error}: give --log-format text|json and --log-level debug|info|warning|error"
        ) from None
    sandbox = (defaults.SANDBOX if options.sandbox is None else options.sandbox).strip().lower()
    if sandbox not in defaults.SANDBOX_MODES:
        raise AgentOptionError(
            f"--sandbox {options.sandbox!r} is not one of {', '.join(defaults.SANDBOX_MODES)}"
        )
    try:
        disk_max = (
            None if options.task_disk_max is None else parse_size(options.task_disk_max, "--task-disk-max")
        )
    except SizeError as error:
        raise AgentOptionError(str(error)) from None
    try:
        servers = parse_servers(defaults.SERVER if options.server is None else options.server)
    except ValueError as error:
        raise AgentOptionError(f"--server: {error}") from None
    work_dir = options.work_dir
    if work_dir is None:
        work_dir = Path(defaults.SERVICE_WORK_DIR if for_unit else defaults.WORK_DIR)
    stop_grace = defaults.STOP_GRACE_S if options.stop_grace_seconds is None else options.stop_grace_seconds
    if options.warm_pool is not None and not 0 <= options.warm_pool <= defaults.MAX_WARM_POOL:
        raise AgentOptionError(
            f"--warm-pool {options.warm_pool}: give 0 (no warm interpreters) to {defaults.MAX_WARM_POOL}"
        )
    return AgentSetup(
        given=options,
        servers=servers,
        name=options.name or socket.gethostname(),
        work_dir=work_dir,
        ports=options.port_range or (defaults.PORT_LOW, defaults.PORT_HIGH),
        sandbox=sandbox,
        task_uids=options.task_uids or (defaults.TASK_UID_LOW, defaults.TASK_UID_HIGH),
        task_disk_max=disk_max,
        ca_file=None if options.ca_file is None else _checked_ca_file(options.ca_file),
        stop_grace=stop_grace,
        log_format=log_format,
        log_level=log_level,
    )


def _checked_ca_file(ca_file: Path) -> Path:
    """`ca_file` resolved, once it is known to hold a PEM certificate."""
    ca_file = ca_file.expanduser().resolve()
    try:
        pem = ca_file.read_bytes()
    except OSError as error:
        raise AgentOptionError(f"cannot read --ca-file {ca_file}: {error.strerror or error}") from None
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise AgentOptionError(
            f"--ca-file {ca_file} holds no PEM certificate: give the coordinator's CA certificate"
        )
    return ca_file


def read_join_token(token_file: Path | None) -> str:
    """The agent's join token from MWMS_JOIN_TOKEN or the content of `token_file`; "" when neither is set.

    MWMS_JOIN_TOKEN is removed from this process's environment, so nothing the agent starts inherits it.
    AgentOptionError when both are given, or the file cannot be read, is empty or others may read it.
    """
    from_environment = os.environ.pop(JOIN_TOKEN_ENV, "").strip()
    if token_file is None:
        return from_environment
    if from_environment:
        raise AgentOptionError(f"give the join token once: {JOIN_TOKEN_ENV} or --join-token-file, not both")
    path = token_file.expanduser()
    try:
        mode = path.stat().st_mode
        token = path.read_text().strip()
    except OSError as error:
        raise AgentOptionError(f"cannot read --join-token-file {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise AgentOptionError(
            f"--join-token-file {path} is not a text file holding the join token"
        ) from None
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        raise AgentOptionError(
            f"--join-token-file {path} can be read by other users (mode {stat.S_IMODE(mode):04o}): "
            f"restrict it with chmod 600 {path}, then start the agent again"
        )
    if not token:
        raise AgentOptionError(
            f"--join-token-file {path} is empty: write the coordinator's join token into it"
        )
    return token

"""`mwms server` and `mwms agent`: the options of the two daemons, and their start.

The options' values become settings in the daemons' own modules (server/settings.py settings_from_options,
worker_agent/config.py check_agent_options); these commands start a daemon with them, or print its systemd
unit, and turn what is wrong with them into CLI errors. The coordinator and the agent are imported inside
the commands, so `mwms --help` stays fast and works without their extras.

Each option is a type of its own, in mwms/cli/server_options.py and mwms/cli/agent_options.py (typer reads
`Annotated` aliases as it reads them inline), in the order --help lists them.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from mwms import log_setup
from mwms.cli.agent_options import (
    AgentAdvertiseAddress,
    AgentCaFile,
    AgentDeviceSampleInterval,
    AgentEnvBuildTimeout,
    AgentEnvCacheBytes,
    AgentEnvCacheDir,
    AgentEnvSourceBuilds,
    AgentJoinToken,
    AgentJoinTokenFile,
    AgentLogFormat,
    AgentLogLevel,
    AgentName,
    AgentPortRange,
    AgentSandbox,
    AgentServerAddress,
    AgentServiceUser,
    AgentSlots,
    AgentStopGraceSeconds,
    AgentSystemdUnit,
    AgentTaskDiskMax,
    AgentTaskPidsMax,
    AgentTaskUids,
    AgentTaskUser,
    AgentTls,
    AgentUser,
    AgentWarmPool,
    AgentWorkDir,
)
from mwms.cli.errors import CliError, handles_errors
from mwms.cli.parsing import parse_port_range, parse_uid_range
from mwms.cli.server_options import (
    ServerAllowedHosts,
    ServerDataDir,
    ServerDbUrl,
    ServerGrpcHost,
    ServerGrpcPort,
    ServerGrpcReflection,
    ServerGrpcTlsCert,
    ServerGrpcTlsKey,
    ServerHangTimeout,
    ServerHost,
    ServerHttpHost,
    ServerHttpPort,
    ServerJoinToken,
    ServerLogFormat,
    ServerLogLevel,
    ServerPortsFile,
    ServerReplicaAddress,
    ServerReplicaName,
    ServerServeRole,
    ServerServiceUser,
    ServerSystemdUnit,
    ServerTlsCert,
    ServerTlsKey,
    ServerTlsSelfSigned,
)

if TYPE_CHECKING:
    from mwms.server.settings import Settings
    from mwms.worker_agent.config import AgentOptions, AgentSetup


@handles_errors(api_param=None)
def server(
    ctx: typer.Context,
    host: ServerHost = None,
    http_host: ServerHttpHost = None,
    grpc_host: ServerGrpcHost = None,
    http_port: ServerHttpPort = None,
    grpc_port: ServerGrpcPort = None,
    data_dir: ServerDataDir = None,
    db_url: ServerDbUrl = None,
    join_token: ServerJoinToken = None,
    allowed_hosts: ServerAllowedHosts = None,
    tls_cert: ServerTlsCert = None,
    tls_key: ServerTlsKey = None,
    grpc_tls_cert: ServerGrpcTlsCert = None,
    grpc_tls_key: ServerGrpcTlsKey = None,
    tls_self_signed: ServerTlsSelfSigned = None,
    hang_timeout: ServerHangTimeout = None,
    ports_file: ServerPortsFile = None,
    log_format: ServerLogFormat = None,
    log_level: ServerLogLevel = None,
    serve_role: ServerServeRole = None,
    replica_name: ServerReplicaName = None,
    replica_address: ServerReplicaAddress = None,
    grpc_reflection: ServerGrpcReflection = None,
    systemd_unit: ServerSystemdUnit = False,
    service_user: ServerServiceUser = None,
) -> None:
    """Run the coordinator: REST API + dashboard over HTTP(S), agent connections over gRPC.

    Every flag overrides its MWMS_* variable (MWMS_DATA_DIR, MWMS_DB_URL, ...), which overrides the
    default. On the first start an admin token is written to <data dir>/admin-token (or MWMS_ADMIN_TOKEN
    is made one).
    """
    if systemd_unit:
        _print_server_unit(ctx, service_user)
        return
    try:
        from mwms.server.main import serve
        from mwms.server.settings import SettingsError, settings_from_options
    except ImportError as error:
        raise CliError(
            f"the coordinator cannot be loaded ({error}); install it with: pip install 'mwms[server]'"
        ) from None
    try:
        settings = settings_from_options(
            host=host,
            http_host=http_host,
            grpc_host=grpc_host,
            http_port=http_port,
            grpc_port=grpc_port,
            data_dir=data_dir,
            db_url=db_url,
            serve=serve_role,
            replica_name=replica_name,
            replica_address=replica_address,
            join_token=join_token,
            allowed_hosts=allowed_hosts,
            tls_cert=tls_cert,
            tls_key=tls_key,
            grpc_tls_cert=grpc_tls_cert,
            grpc_tls_key=grpc_tls_key,
            tls_self_signed=tls_self_signed,
            grpc_reflection=grpc_reflection,
            hang_timeout=hang_timeout,
            ports_file=ports_file,
            log_format=log_format,
            log_level=log_level,
        )
    except SettingsError as error:
        raise CliError(str(error)) from None
    serve(settings)


def _print_server_unit(ctx: typer.Context, service_user: str | None) -> None:
    """Prints mwms-server.service for the `mwms server` flags on this command line (server/systemd_unit.py)."""
    from mwms.server.systemd_unit import DEFAULT_SERVICE_USER, exec_arguments, render_unit
    from mwms.systemd_units import UnitError

    given: list[tuple[str, object]] = []
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if param.name in ("systemd_unit", "service_user") or value is None:
            continue
        if value is False:  # a --no-x of an --x/--no-x pair; a plain flag left off says nothing
            if param.secondary_opts:
                given.append((param.secondary_opts[0], True))
            continue
        # ctx.params holds click's values, before typer makes Path options Paths.
        given.append((param.opts[0], Path(value) if param.type.name == "path" else value))
    try:
        args = ["server", *exec_arguments(given)]
        print(render_unit(*_unit_command(args), service_user or DEFAULT_SERVICE_USER), end="")
    except UnitError as error:
        raise CliError(str(error)) from None


def _unit_command(args: list[str]) -> tuple[str, list[str]]:
    """(executable, args) of a unit's ExecStart= that runs this `mwms` with `args`."""
    launcher = Path(sys.argv[0])
    if launcher.name == "mwms":
        return str(launcher.resolve()), args
    return sys.executable, ["-m", "mwms.cli.main", *args]  # run as `python -m mwms.cli.main`


def _settings(settings_class: type[Settings], given: dict[str, object]) -> Settings:
    """The coordinator's settings from the flags given (by field name) and MWMS_* variables; a bad value is
    a CliError naming the setting, its flag or variable, and what it must be (never a traceback)."""
    from mwms.server.settings import SettingsError, validated_settings

    try:
        return validated_settings(given, settings_class)
    except SettingsError as error:
        raise CliError(str(error)) from None


@handles_errors(api_param=None)
def agent(
    ctx: typer.Context,
    server_address: AgentServerAddress = None,
    name: AgentName = None,
    work_dir: AgentWorkDir = None,
    slots: AgentSlots = None,
    advertise_address: AgentAdvertiseAddress = None,
    port_range: AgentPortRange = None,
    join_token: AgentJoinToken = None,
    join_token_file: AgentJoinTokenFile = None,
    systemd_unit: AgentSystemdUnit = False,
    service_user: AgentServiceUser = None,
    user: AgentUser = None,
    stop_grace_seconds: AgentStopGraceSeconds = None,
    ca_file: AgentCaFile = None,
    tls: AgentTls = False,
    device_sample_interval: AgentDeviceSampleInterval = None,
    sandbox: AgentSandbox = None,
    env_cache_bytes: AgentEnvCacheBytes = None,
    env_cache_dir: AgentEnvCacheDir = None,
    env_build_timeout: AgentEnvBuildTimeout = None,
    env_source_builds: AgentEnvSourceBuilds = False,
    task_user: AgentTaskUser = None,
    task_uids: AgentTaskUids = None,
    task_pids_max: AgentTaskPidsMax = None,
    task_disk_max: AgentTaskDiskMax = None,
    warm_pool: AgentWarmPool = None,
    log_format: AgentLogFormat = None,
    log_level: AgentLogLevel = None,
) -> None:
    """Run an agent on this machine: it joins the coordinator and runs the tasks placed on it.

    The first start needs a join token (MWMS_JOIN_TOKEN or --join-token-file); the agent then keeps its own
    credential in <work dir>/agent-credential and proves who it is with it (also after restarts). Keep that
    file, or an admin must remove the agent (`mwms remove-agent`) before its name can join again.

    Admins take a running agent out of placement with `mwms agent cordon NAME`, move its jobs elsewhere
    with `mwms agent drain NAME`, and put it back with `mwms agent uncordon NAME`.
    """
    if ctx.invoked_subcommand is not None:
        return  # cordon, uncordon or drain: the options above are this machine's agent's, not theirs
    from mwms.worker_agent.config import AgentOptions  # standard library only: no agent extras needed

    options = AgentOptions(
        server=server_address,
        name=name,
        work_dir=work_dir,
        slots=slots,
        advertise_address=advertise_address,
        port_range=None if port_range is None else parse_port_range(port_range),
        join_token=join_token,
        join_token_file=join_token_file,
        stop_grace_seconds=stop_grace_seconds,
        ca_file=ca_file,
        tls=tls,
        device_sample_interval=device_sample_interval,
        sandbox=sandbox,
        env_cache_bytes=env_cache_bytes,
        env_cache_dir=env_cache_dir,
        env_build_timeout=env_build_timeout,
        env_source_builds=env_source_builds,
        task_user=task_user,
        task_uids=None if task_uids is None else parse_uid_range(task_uids),
        task_pids_max=task_pids_max,
        task_disk_max=task_disk_max,
        warm_pool=warm_pool,
        log_format=log_format,
        log_level=log_level,
    )
    if systemd_unit:
        _print_agent_unit(options, service_user or user)
    else:
        _run_agent(options)


def _checked(options: AgentOptions, *, for_unit: bool = False) -> AgentSetup:
    """worker_agent/config.py check_agent_options, its refusals as CliErrors."""
    from mwms.worker_agent.config import AgentOptionError, check_agent_options

    try:
        return check_agent_options(options, for_unit=for_unit)
    except AgentOptionError as error:
        raise CliError(str(error)) from None


def _print_agent_unit(options: AgentOptions, service_user: str | None) -> None:
    """Prints mwms-agent.service running an agent with these options (worker_agent/systemd.py)."""
    from mwms.systemd_units import UnitError
    from mwms.worker_agent.systemd import render_unit

    setup = _checked(options, for_unit=True)
    try:
        unit = render_unit(
            *_unit_command(["agent", *setup.unit_arguments()]),
            service_user,
            work_dir=setup.unit_work_dir,
            stop_grace_seconds=setup.stop_grace,
        )
    except UnitError as error:
        raise CliError(str(error)) from None
    print(unit, end="")


def _run_agent(options: AgentOptions) -> None:
    """Runs an agent with these options until SIGINT or SIGTERM; exits with its exit code."""
    setup = _checked(options)
    try:
        from mwms.worker_agent.config import AgentOptionError
        from mwms.worker_agent.main import run_agent
    except ImportError as error:
        raise CliError(
            f"the agent cannot be loaded ({error}); install it with: pip install 'mwms[agent]'"
        ) from None
    try:
        config = setup.config()  # reads the join token
    except AgentOptionError as error:
        raise CliError(str(error)) from None
    # As `mwms server` does: the agent's lines (registered as, no device telemetry, tasks started and
    # stopped) go to stderr, which systemd's journal or the quickstart's log file keeps.
    log_setup.configure_logging(setup.log_format, setup.log_level)
    stop_event = threading.Event()

    def request_stop(signum: int, _frame: object) -> None:
        stop_event.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    raise typer.Exit(run_agent(config, stop_event))


def read_join_token(token_file: Path | None) -> str:
    """worker_agent/config.py read_join_token (MWMS_JOIN_TOKEN, taken out of the environment, or the
    content of `token_file`), its refusals as CliErrors."""
    from mwms.worker_agent import config

    try:
        return config.read_join_token(token_file)
    except config.AgentOptionError as error:
        raise CliError(str(error)) from None

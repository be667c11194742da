"""`mwms server` and `mwms agent`: the options of the two daemons, and their start.

The options' values become settings in the daemons' own modules (server/settings.py settings_from_options,
worker_agent/config.py check_agent_options); these commands start a daemon with them, or print its systemd
unit, and turn what is wrong with them into CLI errors. The coordinator and the agent are imported inside
the commands, so `mwms --help` stays fast and works without their extras.

Each option is a type of its own below (typer reads `Annotated` aliases as it reads them inline), in the
order --help lists them.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mwms import agent_defaults, log_setup
from mwms.cli.durations import DURATION_METAVAR, duration_option_parser
from mwms.cli.errors import CliError, handles_errors
from mwms.cli.parsing import parse_port_range, parse_uid_range

if TYPE_CHECKING:
    from mwms.server.settings import Settings
    from mwms.worker_agent.config import AgentOptions, AgentSetup

# --- `mwms server`'s options ---

ServerHost = Annotated[
    str | None,
    typer.Option(help="Address both servers bind to [default: 127.0.0.1]; see --http-host, --grpc-host."),
]

ServerHttpHost = Annotated[
    str | None, typer.Option(help="Address the REST API and dashboard bind to (MWMS_HTTP_HOST).")
]

ServerGrpcHost = Annotated[
    str | None, typer.Option(help="Address the agents' gRPC endpoint binds to (MWMS_GRPC_HOST).")
]

ServerHttpPort = Annotated[
    int | None, typer.Option(min=0, max=65535, help="Port of the REST API and dashboard [default: 8080].")
]

ServerGrpcPort = Annotated[
    int | None, typer.Option(min=0, max=65535, help="Port agents connect to [default: 50051].")
]

ServerDataDir = Annotated[
    Path | None,
    typer.Option(
        help="Where the database, bundles and artifacts live, this user's alone (0700) [default: mwms-data]."
    ),
]

ServerDbUrl = Annotated[
    str | None, typer.Option(help="SQLAlchemy database URL; default: SQLite in --data-dir.")
]

ServerJoinToken = Annotated[
    str | None,
    typer.Option(
        help="A bootstrap join token agents may present; give it as MWMS_JOIN_TOKEN rather than this "
        "flag, since every user of the machine can read a command line. Admins can also make revocable "
        "ones with `mwms agent-token create`.",
        show_default=False,
    ),
]

ServerAllowedHosts = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated Host names the HTTP API answers (DNS rebinding); default: loopback "
        "names when bound to loopback, any otherwise."
    ),
]

ServerTlsCert = Annotated[Path | None, typer.Option(help="PEM certificate: serve REST and gRPC over TLS.")]

ServerTlsKey = Annotated[Path | None, typer.Option(help="PEM private key of --tls-cert.")]

ServerGrpcTlsCert = Annotated[
    Path | None, typer.Option(help="PEM certificate for gRPC when it differs from --tls-cert.")
]

ServerGrpcTlsKey = Annotated[Path | None, typer.Option(help="PEM private key of --grpc-tls-cert.")]

ServerTlsSelfSigned = Annotated[
    bool | None,
    typer.Option(
        "--tls-self-signed",
        help="Make a CA and a server certificate in <data dir>/tls and serve TLS with them; prints "
        "the CA's path and fingerprint for agents (--ca-file) and the CLI (MWMS_CA_FILE).",
    ),
]

ServerHangTimeout = Annotated[
    float | None,
    typer.Option(
        parser=duration_option_parser(allow_zero=True, bare_seconds=True),
        metavar=DURATION_METAVAR,
        help="Time without a log line or metric point, e.g. 30m (a bare number is seconds), after "
        "which a RUNNING job that sets no --hang-timeout of its own counts as hung "
        "(MWMS_HANG_TIMEOUT_S) [default: 0, off].",
        show_default=False,
    ),
]

ServerPortsFile = Annotated[
    Path | None,
    typer.Option(
        help='Once both servers listen, write {"http": N, "grpc": M} here: the ports bound, for '
        "--http-port 0 / --grpc-port 0 (MWMS_PORTS_FILE).",
        show_default=False,
    ),
]

ServerLogFormat = Annotated[
    str | None,
    typer.Option(
        help="How the coordinator logs to stderr: text, or json (one object a line, with job and agent "
        f"ids as keys, for journald, Loki and other log shippers) [default: {log_setup.DEFAULT_FORMAT}] "
        "(MWMS_LOG_FORMAT).",
        show_default=False,
    ),
]

ServerLogLevel = Annotated[
    str | None,
    typer.Option(
        help="Log records at this level or above: debug, info, warning or error "
        f"[default: {log_setup.DEFAULT_LEVEL}] (MWMS_LOG_LEVEL).",
        show_default=False,
    ),
]

ServerServeRole = Annotated[
    str | None,
    typer.Option(
        "--serve",
        help="What this replica serves: api (REST + dashboard), agents (the agents' gRPC, with /healthz "
        "and /metrics) or both [default: both]. Several replicas share one PostgreSQL --db-url "
        "(MWMS_SERVE).",
        show_default=False,
    ),
]

ServerReplicaName = Annotated[
    str | None,
    typer.Option(
        help="The name this replica is listed under [default: HOST:PID] (MWMS_REPLICA_NAME).",
        show_default=False,
    ),
]

ServerReplicaAddress = Annotated[
    str | None,
    typer.Option(
        help="The host other machines reach this replica by, shown in the replicas list [default: the "
        "bound host] (MWMS_REPLICA_ADDRESS).",
        show_default=False,
    ),
]

ServerGrpcReflection = Annotated[
    bool | None,
    typer.Option(
        "--grpc-reflection/--no-grpc-reflection",
        help="gRPC server reflection on the agents' port, for grpcurl; grpc.health.v1 is served either "
        "way [default: on] (MWMS_GRPC_REFLECTION).",
        show_default=False,
    ),
]

ServerSystemdUnit = Annotated[
    bool,
    typer.Option(
        "--systemd-unit",
        help="Print a mwms-server.service unit that runs the coordinator with these options, and exit: "
        "mwms server ... --systemd-unit | sudo tee /etc/systemd/system/mwms-server.service. Secrets "
        "(MWMS_DB_URL, MWMS_ADMIN_TOKEN, MWMS_JOIN_TOKEN) go in /etc/mwms/server.env (root, mode 0600), "
        "which the unit reads; the data dir defaults to /var/lib/mwms.",
    ),
]

ServerServiceUser = Annotated[
    str | None,
    typer.Option(
        help="With --systemd-unit: the user the service runs as [default: mwms].", show_default=False
    ),
]


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


# --- `mwms agent`'s options ---
# They default to "not given" (None); the defaults are mwms/agent_defaults.py's, shown in --help.

AgentServerAddress = Annotated[
    str | None,
    typer.Option(
        "--server",
        help="HOST:PORT of the coordinator's gRPC endpoint (IPv6 in brackets: [fd00::5]:50051). With "
        "coordinator replicas, list them comma-separated (a:50051,b:50051; at most "
        f"{agent_defaults.MAX_SERVERS}): the agent talks to one at a time, from the first, and moves to "
        "the next when registering fails or its stream breaks. One DNS name that resolves to several "
        "replicas works too: gRPC tries its addresses in turn. The advertise address is found towards the "
        f"first [default: {agent_defaults.SERVER}].",
        show_default=False,
    ),
]

AgentName = Annotated[str | None, typer.Option(help="This agent's name; default: the hostname.")]

AgentWorkDir = Annotated[
    Path | None,
    typer.Option(
        help=f"Where bundles and task files are kept [default: {agent_defaults.WORK_DIR}].",
        show_default=False,
    ),
]

AgentSlots = Annotated[
    int | None,
    typer.Option(
        min=1,
        help=f"How many CPU tasks may run at once [default: {agent_defaults.SLOTS}].",
        show_default=False,
    ),
]

AgentAdvertiseAddress = Annotated[
    str | None,
    typer.Option(help="Address other workers reach this machine at; default: the route to the coordinator."),
]

AgentPortRange = Annotated[
    str | None,
    typer.Option(
        help=f"LO-HI ports that tasks may listen on [default: {agent_defaults.port_range()}].",
        show_default=False,
    ),
]

# Only so a token given as a flag can be refused with a message (worker_agent/config.py); not in --help.
AgentJoinToken = Annotated[str | None, typer.Option("--join-token", hidden=True)]

AgentJoinTokenFile = Annotated[
    Path | None,
    typer.Option(
        "--join-token-file",
        envvar="MWMS_JOIN_TOKEN_FILE",
        help="A file (mode 0600) holding the coordinator's join token; or set MWMS_JOIN_TOKEN. Needed "
        "at the first start only; never give the token itself on the command line.",
        show_default=False,
    ),
]

AgentSystemdUnit = Annotated[
    bool,
    typer.Option(
        "--systemd-unit",
        help="Print a mwms-agent.service unit that runs this agent with these options, and exit. "
        "Install it with: mwms agent ... --systemd-unit | sudo tee /etc/systemd/system/mwms-agent.service. "
        "The join token is not written into the unit: put MWMS_JOIN_TOKEN=... in /etc/mwms/agent.env "
        "(root, mode 0600), which the unit reads.",
    ),
]

AgentServiceUser = Annotated[
    str | None,
    typer.Option(
        help="With --systemd-unit: the user the service runs as [default: root].", show_default=False
    ),
]

# `--user` was --service-user's name before it matched `mwms server --service-user`; kept, hidden.
AgentUser = Annotated[str | None, typer.Option("--user", hidden=True)]

AgentStopGraceSeconds = Annotated[
    float | None,
    typer.Option(
        min=0,
        max=agent_defaults.MAX_STOP_GRACE_S,
        help="When the agent shuts down, the seconds its tasks get between SIGTERM (to checkpoint and "
        "exit) and SIGKILL; the unit of --systemd-unit waits this long plus "
        f"{agent_defaults.UNIT_STOP_MARGIN_S} s [default: {agent_defaults.STOP_GRACE_S:g}].",
        show_default=False,
    ),
]

AgentCaFile = Annotated[
    Path | None,
    typer.Option(
        "--ca-file",
        envvar="MWMS_CA_FILE",
        help="Connect over TLS and trust this PEM CA certificate for the coordinator (e.g. the CA that "
        "`mwms server --tls-self-signed` made).",
        show_default=False,
    ),
]

AgentTls = Annotated[
    bool,
    typer.Option(
        "--tls",
        help="Connect over TLS, trusting the public CAs gRPC ships with (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH "
        "names another bundle); for a private CA use --ca-file.",
    ),
]

AgentDeviceSampleInterval = Annotated[
    float | None,
    typer.Option(
        parser=duration_option_parser(allow_zero=True, maximum=3600, bare_seconds=True),
        metavar=DURATION_METAVAR,
        help="Time between two samples of the GPUs' utilisation, memory and temperature (NVML), e.g. "
        f"10s (a bare number is seconds; at most 1h); 0: none "
        f"[default: {agent_defaults.DEVICE_SAMPLE_INTERVAL_S:g}s].",
        show_default=False,
    ),
]

AgentSandbox = Annotated[
    str | None,
    typer.Option(
        envvar="MWMS_AGENT_SANDBOX",
        help="How tasks are confined: 'bwrap' (bubblewrap: new mount, PID and IPC namespaces, a private "
        "/tmp, the system read-only, only the task's own dirs and devices), 'off', or 'auto' (bwrap when "
        f"installed, with a warning when not) [default: {agent_defaults.SANDBOX}].",
        show_default=False,
    ),
]

AgentEnvCacheBytes = Annotated[
    int | None,
    typer.Option(
        "--env-cache-bytes",
        min=0,
        envvar="MWMS_AGENT_ENV_CACHE_BYTES",
        help="Size of the cache of jobs' own Python environments (submit --requirements) under the work "
        "dir: past it the least recently used are removed, never one in use; 0: no limit "
        f"[default: {agent_defaults.ENV_CACHE_BYTES // 1024**3} GiB].",
        show_default=False,
    ),
]

AgentEnvCacheDir = Annotated[
    Path | None,
    typer.Option(
        "--env-cache-dir",
        envvar="MWMS_AGENT_ENV_CACHE_DIR",
        help="Where jobs' own Python environments are built and kept; agents on one machine may share "
        "one (each environment is then built once per machine) [default: <work dir>/envs].",
        show_default=False,
    ),
]

AgentEnvBuildTimeout = Annotated[
    float | None,
    typer.Option(
        "--env-build-timeout",
        parser=duration_option_parser(
            minimum=1, maximum=agent_defaults.MAX_ENV_BUILD_TIMEOUT_S, bare_seconds=True
        ),
        metavar=DURATION_METAVAR,
        envvar="MWMS_AGENT_ENV_BUILD_TIMEOUT",
        help="Time one build of a job's own Python environment may take, e.g. 45m (a bare number is "
        "seconds; at most 6h); the job's start-up timeout does not count it "
        f"[default: {agent_defaults.ENV_BUILD_TIMEOUT_S / 60:g}m].",
        show_default=False,
    ),
]

AgentEnvSourceBuilds = Annotated[
    bool,
    typer.Option(
        "--env-source-builds",
        envvar="MWMS_AGENT_ENV_SOURCE_BUILDS",
        help="Let uv build packages that have no wheel for this machine when it builds a job's own "
        "environment. Off by default: a source build runs the package's own build code, which a job "
        "chooses, as the agent's user.",
    ),
]

AgentTaskUser = Annotated[
    str | None,
    typer.Option(
        envvar="MWMS_AGENT_TASK_USER",
        help="With the agent running as root: run every task as this unprivileged user (name or uid). "
        "Default: one uid per concurrent task from --task-uids, so two tasks cannot see each other.",
        show_default=False,
    ),
]

AgentTaskUids = Annotated[
    str | None,
    typer.Option(
        envvar="MWMS_AGENT_TASK_UIDS",
        help="With the agent running as root and no --task-user: LO-HI uids (with gids of the same "
        "numbers) tasks run as, one per concurrent task; none of them may be an existing account "
        f"[default: {agent_defaults.task_uid_range()}].",
        show_default=False,
    ),
]

AgentTaskPidsMax = Annotated[
    int | None,
    typer.Option(
        min=16,
        max=agent_defaults.MAX_TASK_PIDS,
        envvar="MWMS_AGENT_TASK_PIDS_MAX",
        help="Processes and threads one task may have at once (its cgroup's pids.max) "
        f"[default: {agent_defaults.TASK_PIDS_MAX}].",
        show_default=False,
    ),
]

AgentTaskDiskMax = Annotated[
    str | None,
    typer.Option(
        envvar="MWMS_AGENT_TASK_DISK_MAX",
        help="How much one task's files (output, checkpoints, home, temp) may hold, e.g. 100G; the agent "
        "ends a task that writes more, with that reason; 0: no limit "
        f"[default: {agent_defaults.TASK_DISK_MAX // 1024**3}G].",
        show_default=False,
    ),
]

AgentLogFormat = Annotated[
    str | None,
    typer.Option(
        envvar="MWMS_AGENT_LOG_FORMAT",
        help="How the agent logs to stderr: text, or json (one object a line, for journald, Loki and "
        f"other log shippers) [default: {log_setup.DEFAULT_FORMAT}].",
        show_default=False,
    ),
]

AgentLogLevel = Annotated[
    str | None,
    typer.Option(
        envvar="MWMS_AGENT_LOG_LEVEL",
        help="Log records at this level or above: debug, info, warning or error "
        f"[default: {log_setup.DEFAULT_LEVEL}].",
        show_default=False,
    ),
]


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

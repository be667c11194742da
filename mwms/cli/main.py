"""The `mwms` command: the typer app, the `server` and `agent` commands, and the wiring of the others.

Heavy imports (the coordinator, the agent, TensorFlow) happen inside commands so `mwms --help` stays fast.
"""

from __future__ import annotations

import os

# The daemons start helper processes (the coordinator's scheduler and ingest processes, the agent's tasks)
# with fork+exec while gRPC's threads run. gRPC's fork handlers serve children that go on using gRPC, which
# none of these do, and they print a line of their own to stderr ("skipping fork() handlers") that no log
# format can hold. gRPC reads this once, as it loads: before anything here imports it.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
import signal
import socket
import stat
import sys
import threading
from pathlib import Path
from typing import Annotated, Any

import typer

from mwms import __version__, agent_defaults, log_setup
from mwms.cli import admin_commands, auth_commands, job_commands, quickstart, sharing_commands, submit
from mwms.cli.doctor import doctor
from mwms.cli.durations import DURATION_METAVAR, duration_option_parser
from mwms.cli.errors import EXIT_CODES_HELP, CliError, ExitCode, handles_errors
from mwms.cli.option_slips import SuggestingGroup
from mwms.cli.parsing import parse_port_range, parse_uid_range
from mwms.cli.stacks_command import stacks
from mwms.sizes import SizeError, parse_size

app = typer.Typer(
    name="mwms",
    cls=SuggestingGroup,
    help="Run TensorFlow MultiWorkerMirroredStrategy jobs on a fleet of machines.\n\n"
    "Start a coordinator (`mwms server`), an agent per machine (`mwms agent`), then `mwms submit`. "
    "Try it all on one machine with `mwms quickstart`.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version_callback(value: bool) -> None:
    if value:
        print(f"mwms {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """Run TensorFlow MultiWorkerMirroredStrategy jobs on a fleet of machines."""


@app.command()
@handles_errors(api_param=None)
def server(
    ctx: typer.Context,
    host: Annotated[
        str | None,
        typer.Option(help="Address both servers bind to [default: 127.0.0.1]; see --http-host, --grpc-host."),
    ] = None,
    http_host: Annotated[
        str | None, typer.Option(help="Address the REST API and dashboard bind to (MWMS_HTTP_HOST).")
    ] = None,
    grpc_host: Annotated[
        str | None, typer.Option(help="Address the agents' gRPC endpoint binds to (MWMS_GRPC_HOST).")
    ] = None,
    http_port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="Port of the REST API and dashboard [default: 8080].")
    ] = None,
    grpc_port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="Port agents connect to [default: 50051].")
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where the database, bundles and artifacts live, this user's alone (0700) [default: mwms-data]."
        ),
    ] = None,
    db_url: Annotated[
        str | None, typer.Option(help="SQLAlchemy database URL; default: SQLite in --data-dir.")
    ] = None,
    join_token: Annotated[
        str | None,
        typer.Option(
            help="A bootstrap join token agents may present; give it as MWMS_JOIN_TOKEN rather than this "
            "flag, since every user of the machine can read a command line. Admins can also make revocable "
            "ones with `mwms agent-token create`.",
            show_default=False,
        ),
    ] = None,
    allowed_hosts: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated Host names the HTTP API answers (DNS rebinding); default: loopback "
            "names when bound to loopback, any otherwise."
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option(help="PEM certificate: serve REST and gRPC over TLS.")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="PEM private key of --tls-cert.")] = None,
    grpc_tls_cert: Annotated[
        Path | None, typer.Option(help="PEM certificate for gRPC when it differs from --tls-cert.")
    ] = None,
    grpc_tls_key: Annotated[Path | None, typer.Option(help="PEM private key of --grpc-tls-cert.")] = None,
    tls_self_signed: Annotated[
        bool | None,
        typer.Option(
            "--tls-self-signed",
            help="Make a CA and a server certificate in <data dir>/tls and serve TLS with them; prints "
            "the CA's path and fingerprint for agents (--ca-file) and the CLI (MWMS_CA_FILE).",
        ),
    ] = None,
    hang_timeout: Annotated[
        float | None,
        typer.Option(
            parser=duration_option_parser(allow_zero=True, bare_seconds=True),
            metavar=DURATION_METAVAR,
            help="Time without a log line or metric point, e.g. 30m (a bare number is seconds), after "
            "which a RUNNING job that sets no --hang-timeout of its own counts as hung "
            "(MWMS_HANG_TIMEOUT_S) [default: 0, off].",
            show_default=False,
        ),
    ] = None,
    ports_file: Annotated[
        Path | None,
        typer.Option(
            help='Once both servers listen, write {"http": N, "grpc": M} here: the ports bound, for '
            "--http-port 0 / --grpc-port 0 (MWMS_PORTS_FILE).",
            show_default=False,
        ),
    ] = None,
    log_format: Annotated[
        str | None,
        typer.Option(
            help="How the coordinator logs to stderr: text, or json (one object a line, with job and agent "
            f"ids as keys, for journald, Loki and other log shippers) [default: {log_setup.DEFAULT_FORMAT}] "
            "(MWMS_LOG_FORMAT).",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[
        str | None,
        typer.Option(
            help="Log records at this level or above: debug, info, warning or error "
            f"[default: {log_setup.DEFAULT_LEVEL}] (MWMS_LOG_LEVEL).",
            show_default=False,
        ),
    ] = None,
    serve_role: Annotated[
        str | None,
        typer.Option(
            "--serve",
            help="What this replica serves: api (REST + dashboard), agents (the agents' gRPC, with /healthz "
            "and /metrics) or both [default: both]. Several replicas share one PostgreSQL --db-url "
            "(MWMS_SERVE).",
            show_default=False,
        ),
    ] = None,
    replica_name: Annotated[
        str | None,
        typer.Option(
            help="The name this replica is listed under [default: HOST:PID] (MWMS_REPLICA_NAME).",
            show_default=False,
        ),
    ] = None,
    replica_address: Annotated[
        str | None,
        typer.Option(
            help="The host other machines reach this replica by, shown in the replicas list [default: the "
            "bound host] (MWMS_REPLICA_ADDRESS).",
            show_default=False,
        ),
    ] = None,
    grpc_reflection: Annotated[
        bool | None,
        typer.Option(
            "--grpc-reflection/--no-grpc-reflection",
            help="gRPC server reflection on the agents' port, for grpcurl; grpc.health.v1 is served either "
            "way [default: on] (MWMS_GRPC_REFLECTION).",
            show_default=False,
        ),
    ] = None,
    systemd_unit: Annotated[
        bool,
        typer.Option(
            "--systemd-unit",
            help="Print a mwms-server.service unit that runs the coordinator with these options, and exit: "
            "mwms server ... --systemd-unit | sudo tee /etc/systemd/system/mwms-server.service. Secrets "
            "(MWMS_DB_URL, MWMS_ADMIN_TOKEN, MWMS_JOIN_TOKEN) go in /etc/mwms/server.env (root, mode 0600), "
            "which the unit reads; the data dir defaults to /var/lib/mwms.",
        ),
    ] = False,
    service_user: Annotated[
        str | None,
        typer.Option(
            help="With --systemd-unit: the user the service runs as [default: mwms].", show_default=False
        ),
    ] = None,
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
        from mwms.server.settings import Settings
    except ImportError as error:
        raise CliError(
            f"the coordinator cannot be loaded ({error}); install it with: pip install 'mwms[server]'"
        ) from None
    given: dict[str, object] = {
        "http_host": http_host or host,
        "grpc_host": grpc_host or host,
        "http_port": http_port,
        "grpc_port": grpc_port,
        "data_dir": data_dir,
        "db_url": db_url,
        "serve": serve_role,
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
    serve(_settings(Settings, {key: value for key, value in given.items() if value is not None}))


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


def _settings(settings_class: Any, given: dict[str, object]) -> Any:
    """The coordinator's settings from the flags given and MWMS_* variables; a bad value is a CliError
    naming the setting, its flag or variable, and what it must be (never a traceback)."""
    from pydantic import ValidationError

    try:
        return settings_class.model_validate(given)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            name = ".".join(str(part) for part in item["loc"]) or "settings"
            where = f"--{name.replace('_', '-')}" if name in given else f"MWMS_{name.upper()}"
            problems.append(f"{where}: {item['msg']} (got {item.get('input')!r})")
        raise CliError("invalid coordinator setting: " + "; ".join(problems)) from None


JOIN_TOKEN_ENV = "MWMS_JOIN_TOKEN"
# Never echoes the token: the point is that it must not be seen.
JOIN_TOKEN_FLAG_REFUSED = (
    "--join-token is refused: every user of this machine can read a command line (ps, /proc/PID/cmdline). "
    f"Pass the join token in the {JOIN_TOKEN_ENV} environment variable or in a file only you can read: "
    "--join-token-file PATH (chmod 600 PATH)."
)


def read_join_token(token_file: Path | None) -> str:
    """The agent's join token from MWMS_JOIN_TOKEN or the content of `token_file`; "" when neither is set.

    MWMS_JOIN_TOKEN is removed from this process's environment, so nothing the agent starts inherits it.
    """
    from_environment = os.environ.pop(JOIN_TOKEN_ENV, "").strip()
    if token_file is None:
        return from_environment
    if from_environment:
        raise CliError(f"give the join token once: {JOIN_TOKEN_ENV} or --join-token-file, not both")
    path = token_file.expanduser()
    try:
        mode = path.stat().st_mode
        token = path.read_text().strip()
    except OSError as error:
        raise CliError(f"cannot read --join-token-file {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise CliError(f"--join-token-file {path} is not a text file holding the join token") from None
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        raise CliError(
            f"--join-token-file {path} can be read by other users (mode {stat.S_IMODE(mode):04o}): "
            f"restrict it with chmod 600 {path}, then start the agent again"
        )
    if not token:
        raise CliError(f"--join-token-file {path} is empty: write the coordinator's join token into it")
    return token


# `mwms agent [OPTIONS]` runs an agent; `mwms agent cordon|uncordon|drain NAME` acts on one (admin).
agent_app = typer.Typer(
    name="agent",
    invoke_without_command=True,
    no_args_is_help=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@agent_app.callback()
@handles_errors(api_param=None)
def agent(
    ctx: typer.Context,
    # Options default to "not given" (None); the defaults are mwms/agent_defaults.py's, shown in --help.
    server_address: Annotated[
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
    ] = None,
    name: Annotated[str | None, typer.Option(help="This agent's name; default: the hostname.")] = None,
    work_dir: Annotated[
        Path | None,
        typer.Option(
            help=f"Where bundles and task files are kept [default: {agent_defaults.WORK_DIR}].",
            show_default=False,
        ),
    ] = None,
    slots: Annotated[
        int | None,
        typer.Option(
            min=1,
            help=f"How many CPU tasks may run at once [default: {agent_defaults.SLOTS}].",
            show_default=False,
        ),
    ] = None,
    advertise_address: Annotated[
        str | None,
        typer.Option(
            help="Address other workers reach this machine at; default: the route to the coordinator."
        ),
    ] = None,
    port_range: Annotated[
        str | None,
        typer.Option(
            help=f"LO-HI ports that tasks may listen on [default: {agent_defaults.port_range()}].",
            show_default=False,
        ),
    ] = None,
    # Only so a token given as a flag can be refused with a message (see read_join_token); not in --help.
    join_token: Annotated[str | None, typer.Option("--join-token", hidden=True)] = None,
    join_token_file: Annotated[
        Path | None,
        typer.Option(
            "--join-token-file",
            envvar="MWMS_JOIN_TOKEN_FILE",
            help="A file (mode 0600) holding the coordinator's join token; or set MWMS_JOIN_TOKEN. Needed "
            "at the first start only; never give the token itself on the command line.",
            show_default=False,
        ),
    ] = None,
    systemd_unit: Annotated[
        bool,
        typer.Option(
            "--systemd-unit",
            help="Print a mwms-agent.service unit that runs this agent with these options, and exit. "
            "Install it with: mwms agent ... --systemd-unit | sudo tee /etc/systemd/system/mwms-agent.service. "
            "The join token is not written into the unit: put MWMS_JOIN_TOKEN=... in /etc/mwms/agent.env "
            "(root, mode 0600), which the unit reads.",
        ),
    ] = False,
    service_user: Annotated[
        str | None,
        typer.Option(
            help="With --systemd-unit: the user the service runs as [default: root].", show_default=False
        ),
    ] = None,
    # `--user` was this option's name before it matched `mwms server --service-user`; kept, hidden.
    user: Annotated[str | None, typer.Option("--user", hidden=True)] = None,
    stop_grace_seconds: Annotated[
        float | None,
        typer.Option(
            min=0,
            max=agent_defaults.MAX_STOP_GRACE_S,
            help="When the agent shuts down, the seconds its tasks get between SIGTERM (to checkpoint and "
            "exit) and SIGKILL; the unit of --systemd-unit waits this long plus "
            f"{agent_defaults.UNIT_STOP_MARGIN_S} s [default: {agent_defaults.STOP_GRACE_S:g}].",
            show_default=False,
        ),
    ] = None,
    ca_file: Annotated[
        Path | None,
        typer.Option(
            "--ca-file",
            envvar="MWMS_CA_FILE",
            help="Connect over TLS and trust this PEM CA certificate for the coordinator (e.g. the CA that "
            "`mwms server --tls-self-signed` made).",
            show_default=False,
        ),
    ] = None,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls",
            help="Connect over TLS, trusting the public CAs gRPC ships with (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH "
            "names another bundle); for a private CA use --ca-file.",
        ),
    ] = False,
    device_sample_interval: Annotated[
        float | None,
        typer.Option(
            parser=duration_option_parser(allow_zero=True, maximum=3600, bare_seconds=True),
            metavar=DURATION_METAVAR,
            help="Time between two samples of the GPUs' utilisation, memory and temperature (NVML), e.g. "
            f"10s (a bare number is seconds; at most 1h); 0: none "
            f"[default: {agent_defaults.DEVICE_SAMPLE_INTERVAL_S:g}s].",
            show_default=False,
        ),
    ] = None,
    sandbox: Annotated[
        str | None,
        typer.Option(
            envvar="MWMS_AGENT_SANDBOX",
            help="How tasks are confined: 'bwrap' (bubblewrap: new mount, PID and IPC namespaces, a private "
            "/tmp, the system read-only, only the task's own dirs and devices), 'off', or 'auto' (bwrap when "
            f"installed, with a warning when not) [default: {agent_defaults.SANDBOX}].",
            show_default=False,
        ),
    ] = None,
    env_cache_bytes: Annotated[
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
    ] = None,
    env_cache_dir: Annotated[
        Path | None,
        typer.Option(
            "--env-cache-dir",
            envvar="MWMS_AGENT_ENV_CACHE_DIR",
            help="Where jobs' own Python environments are built and kept; agents on one machine may share "
            "one (each environment is then built once per machine) [default: <work dir>/envs].",
            show_default=False,
        ),
    ] = None,
    env_build_timeout: Annotated[
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
    ] = None,
    env_source_builds: Annotated[
        bool,
        typer.Option(
            "--env-source-builds",
            envvar="MWMS_AGENT_ENV_SOURCE_BUILDS",
            help="Let uv build packages that have no wheel for this machine when it builds a job's own "
            "environment. Off by default: a source build runs the package's own build code, which a job "
            "chooses, as the agent's user.",
        ),
    ] = False,
    task_user: Annotated[
        str | None,
        typer.Option(
            envvar="MWMS_AGENT_TASK_USER",
            help="With the agent running as root: run every task as this unprivileged user (name or uid). "
            "Default: one uid per concurrent task from --task-uids, so two tasks cannot see each other.",
            show_default=False,
        ),
    ] = None,
    task_uids: Annotated[
        str | None,
        typer.Option(
            envvar="MWMS_AGENT_TASK_UIDS",
            help="With the agent running as root and no --task-user: LO-HI uids (with gids of the same "
            "numbers) tasks run as, one per concurrent task; none of them may be an existing account "
            f"[default: {agent_defaults.task_uid_range()}].",
            show_default=False,
        ),
    ] = None,
    task_pids_max: Annotated[
        int | None,
        typer.Option(
            min=16,
            max=agent_defaults.MAX_TASK_PIDS,
            envvar="MWMS_AGENT_TASK_PIDS_MAX",
            help="Processes and threads one task may have at once (its cgroup's pids.max) "
            f"[default: {agent_defaults.TASK_PIDS_MAX}].",
            show_default=False,
        ),
    ] = None,
    task_disk_max: Annotated[
        str | None,
        typer.Option(
            envvar="MWMS_AGENT_TASK_DISK_MAX",
            help="How much one task's files (output, checkpoints, home, temp) may hold, e.g. 100G; the agent "
            "ends a task that writes more, with that reason; 0: no limit "
            f"[default: {agent_defaults.TASK_DISK_MAX // 1024**3}G].",
            show_default=False,
        ),
    ] = None,
    log_format: Annotated[
        str | None,
        typer.Option(
            envvar="MWMS_AGENT_LOG_FORMAT",
            help="How the agent logs to stderr: text, or json (one object a line, for journald, Loki and "
            f"other log shippers) [default: {log_setup.DEFAULT_FORMAT}].",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[
        str | None,
        typer.Option(
            envvar="MWMS_AGENT_LOG_LEVEL",
            help="Log records at this level or above: debug, info, warning or error "
            f"[default: {log_setup.DEFAULT_LEVEL}].",
            show_default=False,
        ),
    ] = None,
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
    if join_token is not None:
        raise CliError(JOIN_TOKEN_FLAG_REFUSED)
    try:
        logs_as = log_setup.parse_format(log_format or log_setup.DEFAULT_FORMAT)
        logs_from = log_setup.parse_level(log_level or log_setup.DEFAULT_LEVEL)
    except ValueError as error:
        raise CliError(
            f"{error}: give --log-format text|json and --log-level debug|info|warning|error"
        ) from None
    port_low, port_high = parse_port_range(agent_defaults.port_range() if port_range is None else port_range)
    sandbox_mode = (agent_defaults.SANDBOX if sandbox is None else sandbox).strip().lower()
    if sandbox_mode not in agent_defaults.SANDBOX_MODES:
        raise CliError(f"--sandbox {sandbox!r} is not one of {', '.join(agent_defaults.SANDBOX_MODES)}")
    uid_low, uid_high = parse_uid_range(agent_defaults.task_uid_range() if task_uids is None else task_uids)
    try:
        disk_max = None if task_disk_max is None else parse_size(task_disk_max, "--task-disk-max")
    except SizeError as error:
        raise CliError(str(error)) from None
    server_address = agent_defaults.SERVER if server_address is None else server_address
    if systemd_unit and work_dir is None:  # the service's StateDirectory=, not the caller's home
        work_dir = Path(agent_defaults.SERVICE_WORK_DIR)
    work_dir = Path(agent_defaults.WORK_DIR) if work_dir is None else work_dir
    from mwms.worker_agent.config import parse_servers  # standard library only: no agent extras needed

    try:
        servers = parse_servers(server_address)
    except ValueError as error:
        raise CliError(f"--server: {error}") from None
    server_address = ",".join(servers)
    if ca_file is not None:
        ca_file = ca_file.expanduser().resolve()
        try:
            pem = ca_file.read_bytes()
        except OSError as error:
            raise CliError(f"cannot read --ca-file {ca_file}: {error.strerror or error}") from None
        if b"-----BEGIN CERTIFICATE-----" not in pem:
            raise CliError(
                f"--ca-file {ca_file} holds no PEM certificate: give the coordinator's CA certificate"
            )
    grace = agent_defaults.STOP_GRACE_S if stop_grace_seconds is None else stop_grace_seconds
    if systemd_unit:
        from mwms.systemd_units import UnitError
        from mwms.worker_agent.systemd import render_unit

        unit_work_dir = str(work_dir.expanduser().resolve())
        args = [
            "agent",
            "--server",
            server_address,
            "--name",
            name or socket.gethostname(),
            "--work-dir",
            unit_work_dir,
            "--slots",
            str(agent_defaults.SLOTS if slots is None else slots),
            "--port-range",
            f"{port_low}-{port_high}",
        ]
        if advertise_address:
            args += ["--advertise-address", advertise_address]
        if device_sample_interval is not None:
            args += ["--device-sample-interval", f"{device_sample_interval:g}s"]
        args += ["--sandbox", sandbox_mode, "--task-uids", f"{uid_low}-{uid_high}"]
        args += ["--stop-grace-seconds", f"{grace:g}"]
        if env_cache_bytes is not None:
            args += ["--env-cache-bytes", str(env_cache_bytes)]
        if env_build_timeout is not None:
            args += ["--env-build-timeout", f"{env_build_timeout:g}s"]
        if env_cache_dir is not None:
            args += ["--env-cache-dir", str(env_cache_dir.expanduser().resolve())]
        if env_source_builds:
            args += ["--env-source-builds"]
        if task_pids_max is not None:
            args += ["--task-pids-max", str(task_pids_max)]
        if disk_max is not None:
            args += ["--task-disk-max", str(disk_max)]
        if log_format is not None:
            args += ["--log-format", logs_as]
        if log_level is not None:
            args += ["--log-level", logs_from]
        if task_user:
            args += ["--task-user", task_user]
        if join_token_file is not None:  # not read here: it may well be root's alone
            args += ["--join-token-file", str(join_token_file.expanduser().resolve())]
        if ca_file is not None:
            args += ["--ca-file", str(ca_file)]
        elif tls:
            args += ["--tls"]
        try:
            unit = render_unit(
                *_unit_command(args),
                service_user or user,
                work_dir=unit_work_dir,
                stop_grace_seconds=grace,
            )
        except UnitError as error:
            raise CliError(str(error)) from None
        print(unit, end="")
        return
    try:
        from mwms.worker_agent.config import AgentConfig, local_address_towards
        from mwms.worker_agent.main import run_agent
    except ImportError as error:
        raise CliError(
            f"the agent cannot be loaded ({error}); install it with: pip install 'mwms[agent]'"
        ) from None
    given: dict[str, Any] = {  # AgentConfig holds the defaults of the options not given
        "slots": slots,
        "slots_given": True if slots is not None else None,
        "port_low": None if port_range is None else port_low,
        "port_high": None if port_range is None else port_high,
        "device_sample_interval": device_sample_interval,
        "sandbox": None if sandbox is None else sandbox_mode,
        "task_uids": None if task_uids is None else (uid_low, uid_high),
        "stop_grace": stop_grace_seconds,
        "env_cache_bytes": env_cache_bytes,
        "env_build_timeout": env_build_timeout,
        "env_source_builds": env_source_builds or None,
        "task_pids_max": task_pids_max,
        "task_disk_max": disk_max,
        "env_cache_dir": None if env_cache_dir is None else env_cache_dir.expanduser().resolve(),
    }
    config = AgentConfig(
        server=server_address,
        name=name or socket.gethostname(),
        work_dir=work_dir.expanduser(),
        advertise_address=advertise_address or local_address_towards(servers[0]),
        join_token=read_join_token(join_token_file),
        ca_file=ca_file,
        tls=tls,
        task_user=task_user or None,
        **{field: value for field, value in given.items() if value is not None},
    )
    # As `mwms server` does: the agent's lines (registered as, no device telemetry, tasks started and
    # stopped) go to stderr, which systemd's journal or the quickstart's log file keeps.
    log_setup.configure_logging(logs_as, logs_from)
    stop_event = threading.Event()

    def request_stop(signum: int, _frame: object) -> None:
        stop_event.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    raise typer.Exit(run_agent(config, stop_event))


app.add_typer(agent_app)
agent_app.command("cordon")(sharing_commands.cordon)
agent_app.command("uncordon")(sharing_commands.uncordon)
agent_app.command("drain")(sharing_commands.drain)
app.command(cls=submit.SubmitCommand)(submit.submit)
app.command()(sharing_commands.priority)
app.command()(sharing_commands.queue)
app.add_typer(sharing_commands.team_app)
app.add_typer(sharing_commands.quota_app)
app.command()(job_commands.jobs)
app.command()(job_commands.status)
app.command()(job_commands.logs)
app.command()(job_commands.cancel)
app.command()(job_commands.metrics)
app.command()(job_commands.artifacts)
app.command()(job_commands.agents)
app.command()(stacks)
app.command()(quickstart.quickstart)
app.command()(doctor)
app.command()(auth_commands.login)
app.command()(auth_commands.logout)
app.command()(auth_commands.whoami)
app.add_typer(admin_commands.token_app)
app.add_typer(admin_commands.agent_token_app)
app.command("remove-agent")(admin_commands.remove_agent)

__all__ = ["app", "ExitCode"]

if __name__ == "__main__":
    app()

"""The options of `mwms agent` (mwms/cli/daemons.py), each a type of its own: typer reads `Annotated`
aliases as it reads them inline. They are in the order --help lists them.

They default to "not given" (None); the defaults are mwms/agent_defaults.py's, shown in --help.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mwms import agent_defaults, log_setup
from mwms.cli.durations import DURATION_METAVAR, duration_option_parser

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

AgentWarmPool = Annotated[
    int | None,
    typer.Option(
        min=0,
        max=agent_defaults.MAX_WARM_POOL,
        envvar="MWMS_AGENT_WARM_POOL",
        help="Warm interpreters to keep: sandboxed Pythons that imported TensorFlow already, each waiting "
        "for one task, which then starts without that wait; each holds its memory (about 0.5 GiB) and a "
        f"task uid while it waits; 0: none [default: {agent_defaults.WARM_POOL}].",
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

"""The coordinator's systemd unit (`mwms-server.service`), as `mwms server --systemd-unit` prints it.

The unit runs `mwms server` with the flags given next to `--systemd-unit` (paths made absolute: systemd
starts it in /). Secrets never go into it, since every user of the machine reads command lines (`ps`):
`--join-token` and `--db-url` (which may hold a password) are refused with what to put in
/etc/mwms/server.env instead, which the unit reads (root's, mode 0600; optional: without it the
coordinator keeps SQLite in its data dir). The data dir defaults to systemd's StateDirectory=,
/var/lib/mwms.

It runs as its own user (`--service-user`, default mwms), allows 65,536 open files (one per agent
stream, plus HTTP clients, log follows and the database pool), and is hardened as far as a Python web
server allows: it writes only its data dir, sees no devices, holds no capabilities, cannot make
namespaces or SUID files, and calls only the system calls of an ordinary service (`systemd-analyze
security` scores it 1.3, tests/system/deploy/test_systemd_units.py). deploy/systemd/mwms-server.service is
this module's output for `mwms server --systemd-unit` (a test keeps them equal).

Standard library only: `mwms server --systemd-unit` works where the coordinator's extras are missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from mwms.systemd_units import (
    HOME_DIRS,
    OPEN_FILES_LIMIT,
    UnitError,
    check_lasting_dir,
    check_user,
    quote_argument,
    quote_path,
)

UNIT_NAME = "mwms-server.service"
SERVER_ENV_FILE = "/etc/mwms/server.env"
STATE_DIRECTORY = "mwms"
STATE_DIR = f"/var/lib/{STATE_DIRECTORY}"
DEFAULT_SERVICE_USER = "mwms"
# The coordinator's own stop takes a few seconds (server/main.py SHUTDOWN_GRACE_S, the agents' streams
# closed, the loops stopped); 30 s is ample before SIGKILL.
TIMEOUT_STOP_SECONDS = 30
# Flags whose values are secrets, and the variable of server.env that holds each instead.
SECRET_FLAGS = {"--join-token": "MWMS_JOIN_TOKEN", "--db-url": "MWMS_DB_URL"}
# Flags naming a directory the coordinator writes / a file whose directory it writes.
DATA_DIR_FLAG = "--data-dir"
WRITTEN_FILE_FLAGS = ("--ports-file",)

HARDENING = (
    "UMask=0077",
    "NoNewPrivileges=yes",
    "CapabilityBoundingSet=",
    "AmbientCapabilities=",
    "ProtectSystem=strict",
    "ProtectHome=yes",
    "PrivateTmp=yes",
    "PrivateDevices=yes",
    "PrivateUsers=yes",
    "ProtectKernelTunables=yes",
    "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes",
    "ProtectControlGroups=yes",
    "ProtectClock=yes",
    "ProtectHostname=yes",
    "ProtectProc=invisible",
    "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
    "RestrictNamespaces=yes",
    "RestrictRealtime=yes",
    "RestrictSUIDSGID=yes",
    "LockPersonality=yes",
    "RemoveIPC=yes",
    "SystemCallArchitectures=native",
    "SystemCallFilter=@system-service",
    "SystemCallFilter=~@privileged @resources",
    "SystemCallErrorNumber=EPERM",
    "# Not set: MemoryDenyWriteExecute= (libffi closures, which ctypes and cffi callbacks need, would fail) "
    "and",
    "# ProcSubset=pid (hides /proc/meminfo and /proc/stat from the Python runtime and the libraries it "
    "loads).",
)


def exec_arguments(options: Sequence[tuple[str, object]]) -> list[str]:
    """The words after `mwms server` in ExecStart= for the flags a user gave, in order: (flag, value),
    True for a flag without value. Paths become absolute; --data-dir defaults to /var/lib/mwms.

    UnitError for a secret (it belongs in server.env) and for a path the unit hides from the service."""
    words: list[str] = []
    for flag, value in options:
        if flag in SECRET_FLAGS:
            raise UnitError(
                f"{flag} is a secret and is not written into the unit (every user can read a command line): "
                f"put {SECRET_FLAGS[flag]}=... in {SERVER_ENV_FILE} (root, mode 0600), which the unit reads, "
                f"and leave {flag} out"
            )
        if value is True:
            words.append(flag)
            continue
        text = str(Path(value).expanduser().resolve()) if isinstance(value, Path) else str(value)
        if isinstance(value, Path):
            _check_visible(text, flag)
        words += [flag, text]
    if DATA_DIR_FLAG not in words:
        words += [DATA_DIR_FLAG, STATE_DIR]
    return words


def state_directory(args: Sequence[str]) -> str:
    """StateDirectory= for `mwms server args`: the data dir's name when it is /var/lib/NAME (so a second
    replica on the host, `--data-dir /var/lib/mwms-agents`, gets its own), else mwms."""
    data_dir = PurePosixPath(_value_of(args, DATA_DIR_FLAG) or STATE_DIR)
    return data_dir.name if data_dir.parent == PurePosixPath("/var/lib") else STATE_DIRECTORY


def writable_paths(args: Sequence[str]) -> list[str]:
    """The directories outside the StateDirectory= that `mwms server args` writes: they need
    ReadWritePaths=, since ProtectSystem=strict makes everything else read-only."""
    wanted = []
    for flag, value in zip(args, args[1:], strict=False):
        if flag == DATA_DIR_FLAG:
            wanted.append(PurePosixPath(value))
        elif flag in WRITTEN_FILE_FLAGS:
            wanted.append(PurePosixPath(value).parent)  # written atomically: a temporary file beside it
    state = PurePosixPath("/var/lib") / state_directory(args)
    outside = [p for p in wanted if not (p == state or state in p.parents)]
    return sorted({str(p) for p in outside})


def render_unit(executable: str, args: Sequence[str], user: str = DEFAULT_SERVICE_USER) -> str:
    """The text of mwms-server.service running `executable args...` as `user`."""
    check_user(user, "--service-user")
    command = " ".join(quote_argument(word) for word in [executable, *args])
    writable = [
        line
        for path in writable_paths(args)
        for line in (
            f"# Outside the StateDirectory: must exist, owned by {user}: install -d -m 0700 -o {user} "
            f"{quote_argument(path)}",
            f"ReadWritePaths={quote_path(path)}",
        )
    ]
    lines = [
        "# mwms-server.service, written by `mwms server --systemd-unit`: the mwms coordinator (REST API,",
        "# dashboard, agents' gRPC).",
        "#",
        "# Install (as root; the package in a virtualenv at /opt/mwms: python3 -m venv /opt/mwms &&",
        "# /opt/mwms/bin/pip install 'mwms[server]'):",
        f"#   useradd --system --home-dir {STATE_DIR} --shell /usr/sbin/nologin {user}",
        f"#   install -D -m 0600 -o root -g root server.env.example {SERVER_ENV_FILE}   # then fill it in",
        f"#   mwms server --systemd-unit ... > /etc/systemd/system/{UNIT_NAME} && systemctl daemon-reload",
        "#   systemctl enable --now mwms-server",
        "#",
        f"# Secrets (MWMS_DB_URL's password, MWMS_ADMIN_TOKEN, MWMS_JOIN_TOKEN) live in {SERVER_ENV_FILE}, "
        "read by",
        "# systemd as root, never on the command line (every user of the machine can read `ps`). Addresses, "
        "ports,",
        "# TLS files and the replica's role can be set there too, so one unit serves every replica.",
        f"# The TLS key must be readable by the {user} user (e.g. root:{user}, mode 0640), outside /home.",
        "#",
        '# Several replicas on one PostgreSQL database form one control plane (README.md, "High '
        'availability").',
        "# A host that runs two replicas (say one with --serve api, one with --serve agents) gets two units,",
        "# each printed with its own --data-dir /var/lib/NAME, which becomes its StateDirectory=.",
        "",
        "[Unit]",
        "Description=mwms coordinator: REST API, dashboard and agents' gRPC for MultiWorkerMirroredStrategy "
        "jobs",
        "Documentation=file:///opt/mwms/README.md",
        "Wants=network-online.target",
        "After=network-online.target postgresql.service",
        "# Keep trying while the database is not up yet (after a reboot, or during a PostgreSQL failover).",
        "StartLimitIntervalSec=0",
        "",
        "[Service]",
        "Type=exec",
        f"User={user}",
        f"EnvironmentFile=-{SERVER_ENV_FILE}",
        "Environment=PYTHONUNBUFFERED=1",
        f"ExecStart={command}",
        "Restart=on-failure",
        "RestartSec=5",
        "# SIGTERM: the coordinator closes the agents' streams (they reconnect, to another replica when there "
        "is one)",
        "# and stops its loops; its own grace is a few seconds.",
        "KillSignal=SIGTERM",
        f"TimeoutStopSec={TIMEOUT_STOP_SECONDS}",
        "# One descriptor per agent stream (1,000 agents), plus HTTP clients, log follows and the database "
        "pool.",
        f"LimitNOFILE={OPEN_FILES_LIMIT}",
        "# The out-of-memory killer takes tasks (on a machine that is also an agent) before the coordinator.",
        "OOMScoreAdjust=-900",
        "",
        "# The coordinator writes only its data dir (the database, bundles, artifacts, checkpoints, the first",
        "# admin token, a self-signed CA) and needs no devices, privileges or other address families.",
        f"StateDirectory={state_directory(args)}",
        "StateDirectoryMode=0700",
        *writable,
        *HARDENING,
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


def _value_of(args: Sequence[str], flag: str) -> str | None:
    """The value after the last `flag` in `args`; None when it is not there."""
    found = [value for name, value in zip(args, args[1:], strict=False) if name == flag]
    return found[-1] if found else None


def _check_visible(path: str, flag: str) -> None:
    """UnitError when ProtectHome=yes hides `path` from the service, or PrivateTmp=yes gives the service
    another /tmp than the one `path` is in."""
    check_lasting_dir(path, flag)
    place = PurePosixPath(path)
    for home in HOME_DIRS:
        if place == home or home in place.parents:
            raise UnitError(
                f"{flag} {path} is under {home}, which the unit hides from the coordinator (ProtectHome=yes): "
                f"move it (e.g. TLS files to /etc/mwms, the data dir to {STATE_DIR})"
            )

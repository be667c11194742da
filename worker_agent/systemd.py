"""A systemd unit (`mwms-agent.service`) that keeps the agent running and restarts it when it dies.

KillMode=mixed: on `systemctl stop`/`restart` systemd sends SIGTERM to the agent only, and the agent stops
its tasks itself (SIGTERM to each task's process group, SIGKILL after the grace), reports them and exits;
only what is left after TimeoutStopSec gets SIGKILL from systemd. With the default (control-group) every
task would get SIGTERM at the same moment as the agent, racing the agent's own orderly stop. With
KillMode=process, tasks of a crashed agent would keep running unsupervised until the next agent process
stops them (see agent_state); that stays the safety net for crashes and for setups without systemd, but
mixed leaves no process of the unit behind on a stop. TimeoutStopSec= is the agent's stop grace
(`--stop-grace-seconds`, which the unit passes) plus what the agent's own shutdown may take after it.

Exit code 2 means the coordinator refused the agent (join token, credential, name): restarting cannot help
until someone changes something, so it is not restarted (RestartPreventExitStatus=2).

The join token is never on the command line (every user sees it in `ps`): the unit reads MWMS_JOIN_TOKEN
from EnvironmentFile=/etc/mwms/agent.env (owned by root, mode 0600; the leading `-` lets an agent that
already holds its credential start without it). UMask=0077 keeps what the agent writes (credential,
bundle cache, state, outboxes) to itself unless it sets a mode on purpose. The work dir is systemd's
StateDirectory= (/var/lib/mwms-agent) unless `--work-dir` names another.

Tasks run as other users inside bubblewrap (`apt-get install bubblewrap`), started by the agent as root,
in the agent's own mount namespace, so every option below reaches the tasks too. The hardening kept is
what neither bwrap, setpriv, the GPUs nor a training program need; each option left off has a comment
line in the unit saying what it would break (`OMITTED`). The confinement of a task is its sandbox, not
the unit. An agent that is not root runs bwrap in a user namespace, where the kernel refuses to mount the
task's fresh /proc while parts of the agent's /proc are covered: ProtectKernelTunables=,
ProtectKernelLogs= and ProtectProc= are then left off as well (`ROOT_ONLY`).
"""

from __future__ import annotations

import math
from pathlib import PurePosixPath

from mwms import agent_defaults
from mwms.systemd_units import (
    HOME_DIRS,
    OPEN_FILES_LIMIT,
    check_lasting_dir,
    check_user,
    quote_argument,
    quote_path,
)

UNIT_NAME = "mwms-agent.service"
# Holds `MWMS_JOIN_TOKEN=...`; root's, mode 0600.
AGENT_ENV_FILE = "/etc/mwms/agent.env"
# systemd's StateDirectory= (under /var/lib) and the work dir the unit gives the agent by default.
STATE_DIR = agent_defaults.SERVICE_WORK_DIR
STATE_DIRECTORY = PurePosixPath(STATE_DIR).relative_to("/var/lib").as_posix()
# After the grace: stop_all waits up to 15 s for SIGKILLed tasks to be reaped and their artifacts sent
# (worker_agent/tasks.py), then 5 s for the coordinator's final acks (main.FINAL_ACK_WAIT_SECONDS);
# 10 s more for closing the channel and the interpreter's exit. systemd's SIGKILL comes only after that.
STOP_MARGIN_SECONDS = agent_defaults.UNIT_STOP_MARGIN_S

HARDENING = (
    "PrivateTmp=yes",
    "ProtectHome=read-only",
    "ProtectKernelModules=yes",
    "ProtectHostname=yes",
    "LockPersonality=yes",
    "RestrictRealtime=yes",
    "RestrictSUIDSGID=yes",
    "RemoveIPC=yes",
    "SystemCallArchitectures=native",
    # Capabilities neither the agent, bwrap, setpriv nor NVML use (tasks drop all of theirs anyway).
    "CapabilityBoundingSet=~CAP_SYS_TIME CAP_WAKE_ALARM CAP_SYS_BOOT CAP_SYS_PACCT CAP_LINUX_IMMUTABLE "
    "CAP_MAC_ADMIN CAP_MAC_OVERRIDE CAP_AUDIT_CONTROL CAP_AUDIT_READ CAP_LEASE CAP_BLOCK_SUSPEND",
)
# Kept only when the agent runs as root (see the module docstring).
ROOT_ONLY = ("ProtectKernelTunables=yes", "ProtectKernelLogs=yes", "ProtectProc=invisible")
NOT_ROOT_OMITTED = (
    "# ProtectKernelTunables=, ProtectKernelLogs=, ProtectProc= off: the agent is not root, and the kernel "
    "refuses bwrap's fresh /proc in a user namespace while the unit covers parts of /proc"
)
# One line per option left off on purpose, written into the unit.
OMITTED = (
    "NoNewPrivileges= off: a setuid bwrap (where user namespaces are off) and the driver's setuid "
    "nvidia-modprobe, which makes /dev/nvidia-uvm on first CUDA use, would stop working",
    "CapabilityBoundingSet= not empty: bwrap mounts and makes namespaces (CAP_SYS_ADMIN), setpriv switches "
    "to the task's uid (CAP_SETUID, CAP_SETGID), the agent signals and tidies tasks of other uids",
    "ProtectControlGroups= off: the agent makes a cgroup for every task under its own (Delegate=yes)",
    "CAP_BPF kept: the agent puts each task's port rules (cgroup BPF programs) on its cgroup",
    "PrivateDevices= off: tasks need /dev/nvidia*, /dev/nvidia-caps and /dev/infiniband of the host",
    "DevicePolicy=/DeviceAllow= off: GPU and RDMA device names and majors differ from host to host",
    "ProtectClock= off: it implies DeviceAllow=char-rtc, which closes the device policy and so "
    "/dev/nvidia* (the clock is protected by CapabilityBoundingSet= dropping CAP_SYS_TIME instead)",
    "RestrictNamespaces= off: bwrap makes mount, PID, IPC (and for an agent that is not root, user) "
    "namespaces for every task",
    "SystemCallFilter= off: bwrap needs mount(), pivot_root() and unshare(), setpriv setresuid(), which "
    "@system-service leaves out",
    "ProtectSystem= off: tasks share the agent's mount namespace, and strict would make the datasets and "
    "shared checkpoint dirs jobs write read-only to them",
    "PrivateUsers= off: the agent must be root of the host's user namespace to give tasks their uids",
    "MemoryDenyWriteExecute= off: TensorFlow's XLA, CUDA's PTX JIT and libffi map memory writable and "
    "executable",
    "RestrictAddressFamilies= off: NCCL and RDMA transports (InfiniBand, EFA) use families besides "
    "AF_INET, AF_INET6, AF_UNIX and AF_NETLINK",
    "ProcSubset=pid off: tasks read /proc/meminfo, /proc/cpuinfo and /proc/driver/nvidia",
)


def timeout_stop_seconds(stop_grace_seconds: float) -> int:
    """TimeoutStopSec= for an agent that gives its tasks `stop_grace_seconds` before SIGKILL."""
    return math.ceil(stop_grace_seconds) + STOP_MARGIN_SECONDS


def render_unit(
    executable: str,
    args: list[str],
    user: str | None,
    *,
    work_dir: str | None = None,
    stop_grace_seconds: float = agent_defaults.STOP_GRACE_S,
) -> str:
    """The text of mwms-agent.service running `executable args...` (as `user` when given; root else).

    `work_dir` (absolute) is the `--work-dir` in `args`: one under a home directory is made writable."""
    if user is not None:
        check_user(user, "--service-user")
    command = " ".join(quote_argument(word) for word in [executable, *args])
    writable = []
    if work_dir is not None:
        check_lasting_dir(work_dir, "--work-dir")
        place = PurePosixPath(work_dir)
        if any(home == place or home in place.parents for home in HOME_DIRS):
            writable = [
                f"# ProtectHome=read-only covers the work dir, so it is made writable; it must exist: "
                f"mkdir -m 0700 -p {quote_argument(work_dir)}",
                f"ReadWritePaths={quote_path(work_dir)}",
            ]
    as_root = user in (None, "root", "0")
    service = [
        "Type=simple",
        *([f"User={user}"] if user else []),
        f"ExecStart={command}",
        "Restart=always",
        "RestartSec=2",
        "RestartPreventExitStatus=2",
        "KillMode=mixed",
        "KillSignal=SIGTERM",
        f"TimeoutStopSec={timeout_stop_seconds(stop_grace_seconds)}",
        "Environment=PYTHONUNBUFFERED=1",
        f"EnvironmentFile=-{AGENT_ENV_FILE}",
        f"LimitNOFILE={OPEN_FILES_LIMIT}",
        f"StateDirectory={STATE_DIRECTORY}",
        "StateDirectoryMode=0700",
        "UMask=0077",
        "# Each task gets a cgroup of its own under the agent's (memory, processes, CPU).",
        "Delegate=yes",
        "# The out-of-memory killer takes tasks (oom_score_adj 1000) before the agent.",
        f"OOMScoreAdjust={agent_defaults.AGENT_OOM_SCORE_ADJ}",
        *writable,
        "",
        "# Hardening that leaves bwrap, setpriv, the GPUs and training programs working (tasks inherit it).",
        *HARDENING,
        *(ROOT_ONLY if as_root else [NOT_ROOT_OMITTED]),
        *(f"# {reason}" for reason in OMITTED),
    ]
    lines = [
        "# mwms-agent.service, written by `mwms agent --systemd-unit`.",
        "# Tasks run in a bubblewrap sandbox: apt-get install bubblewrap",
        f"# The join token: {AGENT_ENV_FILE} (root, mode 0600) holding one line MWMS_JOIN_TOKEN=<token>",
        "# ProtectKernelModules=yes: load the NVIDIA modules at boot (nvidia-uvm too: "
        "echo nvidia-uvm > /etc/modules-load.d/nvidia-uvm.conf)",
        "[Unit]",
        "Description=mwms agent: runs MultiWorkerMirroredStrategy tasks for the mwms coordinator",
        "Wants=network-online.target",
        "After=network-online.target",
        # Restart=always forever: never give up after a burst of failures (the coordinator may be down).
        "StartLimitIntervalSec=0",
        "",
        "[Service]",
        *service,
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)

"""A systemd unit (`mwms-agent.service`) that keeps the agent running and restarts it when it dies.

KillMode=mixed: on `systemctl stop`/`restart` systemd sends SIGTERM to the agent only, and the agent stops
its tasks itself (SIGTERM to each task's process group, SIGKILL after the grace), reports them and exits;
only what is left after TimeoutStopSec gets SIGKILL from systemd. With the default (control-group) every
task would get SIGTERM at the same moment as the agent, racing the agent's own orderly stop. With
KillMode=process, tasks of a crashed agent would keep running unsupervised until the next agent process
stops them (see agent_state); that stays the safety net for crashes and for setups without systemd, but
mixed leaves no process of the unit behind on a stop.

Exit code 2 means the coordinator refused the agent (join token, credential, name): restarting cannot help
until someone changes something, so it is not restarted (RestartPreventExitStatus=2).

The join token is never on the command line (every user sees it in `ps`): the unit reads MWMS_JOIN_TOKEN
from EnvironmentFile=/etc/mwms/agent.env (owned by root, mode 0600; the leading `-` lets an agent that
already holds its credential start without it). UMask=0077 keeps what the agent writes (credential,
bundle cache, state, outboxes) to itself unless it sets a mode on purpose.

Tasks run as other users inside bubblewrap (`apt-get install bubblewrap`), started by the agent as root,
so the usual hardening is left off on purpose: NoNewPrivileges=, CapabilityBoundingSet=,
SystemCallFilter= and RestrictNamespaces= would stop bwrap and setpriv from switching users, creating
namespaces and mounting; ProtectSystem=, ProtectHome= and PrivateTmp= would be inherited by every task
(they run in the agent's mount namespace) and need per-site ReadWritePaths= for the work dir and the data
jobs read. The confinement is the sandbox around each task, not the unit.
"""

from __future__ import annotations

import re

UNIT_NAME = "mwms-agent.service"
# The agent's default stop grace (10 s) per task, the final acks (5 s) and a chief's last uploads.
TIMEOUT_STOP_SECONDS = 60
# Holds `MWMS_JOIN_TOKEN=...`; root's, mode 0600.
AGENT_ENV_FILE = "/etc/mwms/agent.env"
_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def quote_argument(argument: str) -> str:
    """`argument` as one word of an ExecStart= line (systemd.syntax quoting; `%` and `$` escaped)."""
    escaped = argument.replace("%", "%%").replace("$", "$$")
    if _SAFE.fullmatch(argument):
        return escaped
    escaped = escaped.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def render_unit(executable: str, args: list[str], user: str | None) -> str:
    """The text of mwms-agent.service running `executable args...` (as `user` when given)."""
    command = " ".join(quote_argument(word) for word in [executable, *args])
    service = [
        "Type=simple",
        f"ExecStart={command}",
        "Restart=always",
        "RestartSec=2",
        "RestartPreventExitStatus=2",
        "KillMode=mixed",
        "KillSignal=SIGTERM",
        f"TimeoutStopSec={TIMEOUT_STOP_SECONDS}",
        "Environment=PYTHONUNBUFFERED=1",
        f"EnvironmentFile=-{AGENT_ENV_FILE}",
        "UMask=0077",
    ]
    if user:
        service.insert(1, f"User={user}")
    lines = [
        "# mwms-agent.service, written by `mwms agent --systemd-unit`.",
        "# Tasks run in a bubblewrap sandbox: apt-get install bubblewrap",
        f"# The join token: {AGENT_ENV_FILE} (root, mode 0600) holding one line MWMS_JOIN_TOKEN=<token>",
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

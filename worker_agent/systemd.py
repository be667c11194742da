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
"""

from __future__ import annotations

import re

UNIT_NAME = "mwms-agent.service"
# The agent's default stop grace (10 s) per task, the final acks (5 s) and a chief's last uploads.
TIMEOUT_STOP_SECONDS = 60
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
    ]
    if user:
        service.insert(1, f"User={user}")
    lines = [
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

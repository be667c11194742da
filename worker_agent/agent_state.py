"""The agent's task table on disk (`work_dir/agent-state.json`), and stopping the orphans it names.

The table is replaced atomically at every change, so when the agent dies (crash, SIGKILL, OOM) the next
agent process on the same work dir knows which tasks it ran and which process groups they were. A task
whose group outlived the agent cannot be supervised any more (its output pipes died with the agent), so
the new agent stops it and reports it failed; the coordinator then restarts the job under its policy.

A pid is trusted only on the same boot and, while the group leader lives, with the same start time, so
a reboot or pid reuse never makes the agent signal someone else's processes.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from mwms.worker_agent.outbox import write_atomically

log = logging.getLogger("mwms.agent.state")

FORMAT_VERSION = 1
# How long `stop_groups` waits for the groups to go after its SIGKILL.
KILL_WAIT_S = 5.0


@dataclass
class TaskEntry:
    """What the next agent process needs to know about one task."""

    task_id: str
    job_id: str
    attempt: int
    task_index: int
    state: int  # agent_pb2.TaskState
    pid: int = 0
    pgid: int = 0
    # The group leader's start time in clock ticks since boot (/proc/<pid>/stat field 22).
    start_ticks: int = 0
    boot_id: str = ""
    exit_code: int = 0
    message: str = ""
    final_acked: bool = False
    # The uid of its own it ran as (0: the agent's, or a fixed --task-user): taken back after a restart
    # so that what still runs as it is stopped before the uid passes on (worker_agent/task_users.py).
    uid: int = 0
    # Its task dir when not where its job, attempt and index put it (a warm start's, worker_agent/warm_pool.py).
    task_dir: str = ""


class AgentStateFile:
    """Reads and atomically replaces the task table."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[TaskEntry]:
        """The recorded tasks; an empty list when there is no table or it cannot be read."""
        try:
            document = json.loads(self.path.read_text())
            names = {field.name for field in fields(TaskEntry)}
            return [
                TaskEntry(**{key: value for key, value in raw.items() if key in names})
                for raw in document.get("tasks", [])
            ]
        except FileNotFoundError:
            return []
        except (ValueError, TypeError, AttributeError) as error:
            log.warning("ignoring the unreadable task table %s: %s", self.path, error)
            return []

    def save(self, entries: list[TaskEntry]) -> None:
        """Replaces the table with `entries`."""
        document = {"version": FORMAT_VERSION, "tasks": [asdict(entry) for entry in entries]}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, json.dumps(document, indent=1).encode())


@functools.cache
def boot_id() -> str:
    """This boot's random id (Linux); pids from another boot mean nothing."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_start_ticks(pid: int) -> int:
    """The process's start time in clock ticks since boot; 0 when it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    # The command name (field 2) may hold spaces and parentheses: split after its closing ")".
    after_name = stat.rsplit(")", 1)[1].split()
    try:
        return int(after_name[19])
    except (IndexError, ValueError):
        return 0


def group_is_alive(pgid: int) -> bool:
    """True when a process that is not a zombie is still in process group `pgid`.

    Zombies do not count: orphans of a dead agent are reparented to init, which may reap them late.
    """
    if pgid <= 0:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            after_name = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(after_name) > 2 and after_name[2] == str(pgid) and after_name[0] not in ("Z", "X"):
            return True
    return False


def owns_live_group(entry: TaskEntry) -> bool:
    """True when `entry`'s process group still exists and is certainly the one the agent started."""
    if entry.pgid <= 0 or not entry.boot_id or entry.boot_id != boot_id():
        return False
    if not group_is_alive(entry.pgid):
        return False
    leader_ticks = process_start_ticks(entry.pgid)
    # While the group exists its id cannot be reused as a pid; a leader with another start time is a
    # new process that reused the number after our group ended.
    return leader_ticks == 0 or leader_ticks == entry.start_ticks


def stop_groups(pgids: list[int], grace_seconds: float) -> None:
    """SIGTERM to every group, SIGKILL to those still alive after `grace_seconds`; returns once all are gone."""
    for pgid in pgids:
        _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + max(0.0, grace_seconds)
    while any(map(group_is_alive, pgids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pgid in filter(group_is_alive, pgids):
        log.info("process group %d outlived SIGTERM by %.0f s; killing it", pgid, grace_seconds)
        _signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while any(map(group_is_alive, pgids)) and time.monotonic() < deadline:
        time.sleep(0.05)


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass

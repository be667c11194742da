"""One task's cgroup once made: the limits it holds, the argv prefix that puts a task into it before
anything of the task runs, its members, peak memory and OOM kills, ending what is left in it and
removing it. worker_agent/cgroups.py finds the hierarchy and makes and limits these cgroups."""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("mwms.agent.cgroups")

# A hybrid v1 host's v2 hierarchy (no controllers; the task's socket programs attach there).
UNIFIED = "unified"
# A task's oom_score_adj: killed first, before anything of the host (the agent sets its own low).
TASK_OOM_SCORE_ADJ = 1000
REMOVE_TRIES = 50
REMOVE_PAUSE_S = 0.05
# How long the last processes of a killed task may take to exit before the rest are killed.
SETTLE_S = 1.0
# Joins the cgroups named before "--", raises its OOM score, then execs what follows "--".
JOIN_SCRIPT = (
    'for f in "$@"; do shift; [ "$f" = -- ] && break; '
    'echo $$ > "$f" || { echo "mwms-agent: could not join the task cgroup $f" >&2; exit 1; }; done; '
    f"echo {TASK_OOM_SCORE_ADJ} > /proc/$$/oom_score_adj 2>/dev/null; "
    'exec "$@"'
)


@dataclass(frozen=True)
class TaskLimits:
    """What one task is held to: memory in bytes (0: none), processes, CPU weight and cap."""

    memory_bytes: int = 0
    pids_max: int = 0
    devices: int = 1  # its CPU weight, in devices held
    cpus: float = 0.0  # a hard cap in CPUs (0: none)
    # The least CPU weight there is (a warm interpreter's, worker_agent/warm_pool.py: its warm-up is
    # speculative and yields to running tasks); its task's weight is written at handout.
    background: bool = False


@dataclass
class TaskCgroup:
    """One task's cgroup (a directory per v1 controller, or one v2 directory)."""

    version: int
    dirs: dict[str, Path] = field(default_factory=dict)  # controller ("" for v2) -> directory
    limits: TaskLimits = field(default_factory=TaskLimits)

    def join_argv(self) -> list[str]:
        """The argv prefix that puts the process started with it into this cgroup before it execs."""
        procs = sorted({str(d / "cgroup.procs") for d in self.dirs.values()})
        return ["/bin/sh", "-c", JOIN_SCRIPT, "mwms-join", *procs, "--"]

    @property
    def bpf_dir(self) -> Path | None:
        """Its cgroup v2 directory, where programs on its sockets attach (worker_agent/port_guard.py):
        the unified hierarchy's on a v1 host that mounts one."""
        return self.dirs.get("" if self.version == 2 else UNIFIED)

    def _dir(self, controller: str) -> Path | None:
        return self.dirs.get("" if self.version == 2 else controller)

    def peak_memory(self) -> int:
        """The most memory the task has held (0: unknown)."""
        directory = self._dir("memory")
        if directory is None:
            return 0
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        return _read_int(directory / name)

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the task for its memory limit."""
        directory = self._dir("memory")
        if directory is None:
            return False
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        return _read_keyed(directory / name).get("oom_kill", 0) > 0

    def processes(self) -> list[int]:
        """The pids in the task's cgroup now."""
        found: set[int] = set()
        for directory in self.dirs.values():
            try:
                text = (directory / "cgroup.procs").read_text()
            except OSError:
                continue
            found.update(int(line) for line in text.split() if line.isdigit())
        return sorted(found)

    def kill_all(self) -> int:
        """SIGKILLs whatever still runs in the task's cgroup (a process that left its group); how many."""
        directory = self._dir("")
        if self.version == 2 and directory is not None and (directory / "cgroup.kill").exists():
            members = self.processes()
            if members:
                write_control(directory / "cgroup.kill", "1")
            return len(members)
        killed = 0
        for _ in range(10):  # a process forking meanwhile leaves a child: go again
            members = self.processes()
            if not members:
                break
            for pid in members:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        return killed

    def remove(self) -> None:
        """Ends what is left in the cgroup and removes it (a dying process holds it a moment longer)."""
        deadline = time.monotonic() + SETTLE_S
        while self.processes() and time.monotonic() < deadline:
            time.sleep(REMOVE_PAUSE_S)  # the task's group was just killed: its last processes are exiting
        if self.processes():
            count = self.kill_all()
            log.warning("ended %d process(es) left in a task cgroup (they had left the task's group)", count)
        for directory in self.dirs.values():
            for _ in range(REMOVE_TRIES):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as error:
                    if error.errno != errno.EBUSY:
                        log.warning("could not remove the task cgroup %s: %s", directory, error)
                        break
                    time.sleep(REMOVE_PAUSE_S)


def write_control(path: Path, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _read_keyed(path: Path) -> dict[str, int]:
    found: dict[str, int] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            found[parts[0]] = int(parts[1])
    return found

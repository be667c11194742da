"""What each task is held to on this agent: memory, processes, CPU and disk, and the words for a breach.

- Memory: the job's `--memory-per-worker` (StartTask.memory_limit_bytes), else the memory this agent
  offers (the machine's, less a reserve for the agent, the system and page cache) shared in proportion to
  the devices the task holds: a 1-GPU task on an 8-GPU machine gets an eighth.
- Processes: `--task-pids-max` (4096 by default).
- CPU: a weight in proportion to the devices held, and a cap when the job asks `--cpus-per-worker`.
- Disk: the task's own files (output, checkpoints, home, temp) up to `--task-disk-max`, which the agent
  watches (worker_agent/tasks.py), as few filesystems under a work dir have project quotas enabled.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from mwms.sizes import format_size
from mwms.v1 import agent_pb2
from mwms.worker_agent.cgroups import TaskLimits

GIB = 1024**3
# Kept back from tasks: a tenth of the machine, at least 1 GiB and at most 16 GiB.
RESERVE_FRACTION = 0.10
RESERVE_MIN = 1 * GIB
RESERVE_MAX = 16 * GIB


def machine_memory(meminfo: Path = Path("/proc/meminfo")) -> int:
    """The machine's memory in bytes (0: unknown)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def offered_memory(total: int) -> int:
    """What this agent offers its tasks in all: the machine's memory less the reserve."""
    if total <= 0:
        return 0
    reserve = min(RESERVE_MAX, max(RESERVE_MIN, int(total * RESERVE_FRACTION)))
    return max(total - reserve, total // 2)


class LimitPolicy:
    """Turns a StartTask into the limits its task gets here, and explains a breach."""

    def __init__(
        self,
        devices: Sequence[agent_pb2.Device],
        offered_memory_bytes: int,
        pids_max: int,
        disk_max_bytes: int,
    ) -> None:
        self._counts: dict[int, int] = {}
        for device in devices:
            self._counts[device.kind] = self._counts.get(device.kind, 0) + 1
        self.offered_memory_bytes = offered_memory_bytes
        self.pids_max = pids_max
        self.disk_max_bytes = disk_max_bytes

    def limits(self, start: agent_pb2.StartTask) -> TaskLimits:
        """The limits of the task `start` places."""
        held = max(1, len(start.device_indices))
        memory = start.memory_limit_bytes
        if memory <= 0 and self.offered_memory_bytes > 0:
            of_kind = max(held, self._counts.get(start.device_kind, held))
            memory = self.offered_memory_bytes * held // of_kind
        return TaskLimits(
            memory_bytes=max(0, memory), pids_max=self.pids_max, devices=held, cpus=max(0.0, start.cpus)
        )

    @staticmethod
    def out_of_memory(start: agent_pb2.StartTask, limits: TaskLimits) -> str:
        """The reason of a task the kernel killed at its memory limit."""
        if start.memory_limit_bytes > 0:
            return f"out of memory: {format_size(limits.memory_bytes)} limit (--memory-per-worker)"
        return (
            f"out of memory: {format_size(limits.memory_bytes)} limit (this agent's share for a task with "
            f"{limits.devices} device{'s' if limits.devices != 1 else ''}); ask for more with "
            "--memory-per-worker"
        )

    def over_disk(self, used: int) -> str:
        """The reason of a task ended for the size of its files."""
        return (
            f"out of disk: the task's files (output, checkpoints, home, temp) hold {format_size(used)}, over "
            f"this agent's {format_size(self.disk_max_bytes)} limit (--task-disk-max); write less, or keep "
            "large data outside the task's dirs"
        )


def disk_usage(directory: Path, skip: Sequence[Path] = ()) -> int:
    """Bytes the files under `directory` take on disk (hard links once; `skip` left out)."""
    total = 0
    seen: set[tuple[int, int]] = set()
    skipped = {str(p) for p in skip}
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if os.path.join(root, d) not in skipped]
        for name in files:
            try:
                info = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            total += info.st_blocks * 512
    return total

"""Each task in a cgroup of its own: its memory, processes and CPU held to limits, its peak memory known.

What a task gets (Slurm's task/cgroup plugin and a Kubernetes container, for the same threat):
- memory: a hard limit and no swap; the pages it writes to its tmpfs mounts (/tmp, /var/tmp, its job's
  /dev/shm) are charged to it like its own memory, so a full /tmp is an out-of-memory kill, not a host
  out of RAM. With cgroup v2 the kill takes the whole task (`memory.oom.group`): a TensorFlow worker
  missing a thread is no use to its peers;
- processes: `pids.max` (a fork bomb stops at it);
- CPU: a weight in proportion to the devices the task holds, and a hard cap (`cpu.max`, v1's CFS quota)
  when its job asks for `--cpus-per-worker`.

Both hierarchies work: v2 (current distributions; under systemd the agent's unit has `Delegate=yes`, so
the agent owns its cgroup, moves itself into a leaf `agent` and makes `tasks/<task>` beside it) and v1
(one mount per controller, as on older hosts). The task cgroups always nest under the agent's own cgroup
(a hand-started root agent on v2 that shares its cgroup with other processes uses `/mwms-tasks-<tag>`
instead), so the host's own limits on the agent hold its tasks too.

A task joins its cgroup before anything of it runs: its argv starts with a tiny `/bin/sh` shim, run as
root by the agent, that writes its own pid into the cgroup and raises its OOM score (tasks are killed
before the agent and the coordinator), then execs the sandbox. Its children are born inside.

One task's cgroup, once made (its members, peak memory, removal), is worker_agent/task_cgroup.py's.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from mwms import agent_defaults
from mwms.worker_agent.task_cgroup import UNIFIED, write_control
from mwms.worker_agent.task_cgroup import TaskCgroup as TaskCgroup
from mwms.worker_agent.task_cgroup import TaskLimits as TaskLimits

log = logging.getLogger("mwms.agent.cgroups")

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu")
AGENT_OOM_SCORE_ADJ = agent_defaults.AGENT_OOM_SCORE_ADJ
# cpu weight per device held (v2's default weight is 100; v1's shares default is 1024).
V2_WEIGHT_PER_DEVICE = 100
V1_SHARES_PER_DEVICE = 1024
CFS_PERIOD_US = 100_000


class CgroupError(Exception):
    """A task cgroup could not be made or limited; the message says what and why."""


class TaskCgroups:
    """Makes and limits task cgroups under one parent per controller (v1) or one parent (v2)."""

    def __init__(self, version: int, parents: dict[str, Path]) -> None:
        self.version = version
        self.parents = parents  # controller -> parent dir (v2: "" -> parent dir)

    @property
    def bpf_parent(self) -> Path | None:
        """Where task cgroups v2 directories are made (None: nowhere on this host)."""
        return self.parents.get("" if self.version == 2 else UNIFIED)

    def describe(self) -> str:
        """A few words for the log and the agent list."""
        held = (
            "memory, processes, CPU"
            if self.version == 2
            else ", ".join(sorted(set(self.parents) - {UNIFIED}))
        )
        return f"cgroup v{self.version} per task ({held})"

    def create(self, task_id: str, limits: TaskLimits) -> TaskCgroup:
        """A fresh cgroup for `task_id` (one a crashed agent left is emptied and reused) with `limits`."""
        name = _safe_name(task_id)
        cgroup = TaskCgroup(self.version, limits=limits)
        try:
            for controller, parent in self.parents.items():
                directory = parent / name
                if directory.is_dir():
                    TaskCgroup(self.version, {controller: directory}).remove()
                directory.mkdir(exist_ok=True)
                cgroup.dirs[controller] = directory
            if self.version == 2:
                _limit_v2(cgroup.dirs[""], limits)
            else:
                _limit_v1(cgroup.dirs, limits)
        except OSError as error:
            cgroup.remove()
            raise CgroupError(f"could not make the task's cgroup: {error}") from error
        return cgroup

    def limit(self, cgroup: TaskCgroup, limits: TaskLimits) -> None:
        """Holds an existing cgroup (a warm interpreter's, given to its task) to `limits` from now on."""
        try:
            if self.version == 2:
                _limit_v2(cgroup.dirs[""], limits)
            else:
                _limit_v1(cgroup.dirs, limits)
        except OSError as error:
            raise CgroupError(f"could not limit the task's cgroup: {error}") from error
        cgroup.limits = limits

    def clean_stale(self) -> int:
        """Removes the task cgroups a previous agent process left (their processes are ended first)."""
        removed = 0
        for controller, parent in self.parents.items():
            for child in parent.iterdir() if parent.is_dir() else ():
                if child.is_dir():
                    TaskCgroup(self.version, {controller: child}).remove()
                    removed += 1
        return removed


def detect(work_dir: Path, root: Path = CGROUP_ROOT) -> tuple[TaskCgroups | None, str]:
    """The task cgroups this agent can make, tried once with limits like a task's, or (None, why not)."""
    tag = hashlib.sha256(str(Path(os.path.realpath(work_dir))).encode()).hexdigest()[:12]
    own = own_cgroups()
    if (root / "cgroup.controllers").is_file() and "" in own:
        found, why = _detect_v2(root, own[""], tag)
    elif (root / "memory" / "cgroup.procs").is_file() or (root / "pids" / "cgroup.procs").is_file():
        found, why = _detect_v1(root, own, tag)
    else:
        return None, f"no cgroup hierarchy is mounted at {root}"
    if found is not None:
        # A hierarchy that refuses a limit would reject every task: find out now, not at the first task.
        try:
            found.create(
                "probe", TaskLimits(memory_bytes=64 * 1024**2, pids_max=64, devices=1, cpus=0.5)
            ).remove()
        except CgroupError as error:
            return None, str(error)
    return found, why


def own_cgroups(path: Path = Path("/proc/self/cgroup")) -> dict[str, str]:
    """This process's cgroup per v1 controller, and its v2 cgroup under the key ""."""
    found: dict[str, str] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, where = parts
        if parts[0] == "0" and not controllers:
            found[""] = where
        for controller in controllers.split(","):
            if controller:
                found[controller] = where
    return found


def _detect_v1(root: Path, own: dict[str, str], tag: str) -> tuple[TaskCgroups | None, str]:
    parents: dict[str, Path] = {}
    missing = []
    for controller in CONTROLLERS:
        mount = _v1_mount(root, controller)
        if mount is None or controller not in own:
            missing.append(controller)
            continue
        parent = mount / own[controller].lstrip("/") / f"mwms-tasks-{tag}"
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            return None, f"cannot make task cgroups under {parent.parent} ({error.strerror})"
        parents[controller] = parent
    if "memory" not in parents:
        return None, "the cgroup v1 memory controller is not mounted"
    unified = root / UNIFIED
    if (unified / "cgroup.controllers").is_file() and "" in own:
        # No controllers here, but a v2 cgroup of the task's own for the programs on its sockets.
        parent = unified / own[""].lstrip("/") / f"mwms-tasks-{tag}"
        try:
            parent.mkdir(parents=True, exist_ok=True)
            parents[UNIFIED] = parent
        except OSError as error:
            log.warning("cannot make task cgroups under %s (%s)", parent.parent, error.strerror)
    if missing:
        log.warning("cgroup v1: no %s controller; tasks are not held to it", ", ".join(missing))
    return TaskCgroups(1, parents), ""


def _v1_mount(root: Path, controller: str) -> Path | None:
    for candidate in sorted(root.iterdir()) if root.is_dir() else ():
        if controller in candidate.name.split(",") and (candidate / "cgroup.procs").is_file():
            return candidate.resolve()
    return None


def _detect_v2(root: Path, own: str, tag: str) -> tuple[TaskCgroups | None, str]:
    """Delegated (the agent's cgroup holds only it: it moves into `agent`, tasks go into `tasks`), else,
    as root, a cgroup of its own at the top."""
    mine = root / own.lstrip("/")
    wanted = [c for c in CONTROLLERS if c in _words(root / "cgroup.controllers")]
    if own != "/" and _only_this_process(mine):
        try:
            leaf = mine / "agent"
            leaf.mkdir(exist_ok=True)
            write_control(leaf / "cgroup.procs", str(os.getpid()))
            _enable(mine, wanted)
            parent = mine / "tasks"
            parent.mkdir(exist_ok=True)
            _enable(parent, wanted)
            return TaskCgroups(2, {"": parent}), ""
        except OSError as error:
            log.info("cannot use the agent's own cgroup %s for tasks (%s)", mine, error.strerror)
    if os.geteuid() != 0:
        return None, (
            f"the agent's cgroup {own} is not delegated to it: run it under systemd with Delegate=yes "
            "(`mwms agent --systemd-unit` writes such a unit), or as root"
        )
    try:
        _enable(root, wanted)
        parent = root / f"mwms-tasks-{tag}"
        parent.mkdir(exist_ok=True)
        _enable(parent, wanted)
    except OSError as error:
        return None, f"cannot make task cgroups under {root} ({error.strerror})"
    return TaskCgroups(2, {"": parent}), ""


def _only_this_process(directory: Path) -> bool:
    try:
        members = (directory / "cgroup.procs").read_text().split()
    except OSError:
        return False
    return members == [str(os.getpid())] and os.access(directory / "cgroup.subtree_control", os.W_OK)


def _enable(directory: Path, controllers: list[str]) -> None:
    enabled = _words(directory / "cgroup.subtree_control")
    todo = [c for c in controllers if c not in enabled]
    if todo:
        write_control(directory / "cgroup.subtree_control", " ".join(f"+{c}" for c in todo))


def _limit_v2(directory: Path, limits: TaskLimits) -> None:
    if limits.memory_bytes:
        write_control(directory / "memory.max", str(limits.memory_bytes))
        _write_if_present(directory / "memory.swap.max", "0")
        _write_if_present(directory / "memory.oom.group", "1")
    if limits.pids_max:
        _write_if_present(directory / "pids.max", str(limits.pids_max))
    weight = 1 if limits.background else max(1, min(10_000, V2_WEIGHT_PER_DEVICE * max(1, limits.devices)))
    _write_if_present(directory / "cpu.weight", str(weight))
    if limits.cpus > 0:
        _write_if_present(directory / "cpu.max", f"{_quota_us(limits.cpus)} {CFS_PERIOD_US}")


def _limit_v1(dirs: dict[str, Path], limits: TaskLimits) -> None:
    memory = dirs.get("memory")
    if memory is not None and limits.memory_bytes:
        write_control(memory / "memory.limit_in_bytes", str(limits.memory_bytes))
        # memory+swap at the same limit: no swap at all.
        _write_if_present(memory / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        _write_if_present(memory / "memory.swappiness", "0")
    pids = dirs.get("pids")
    if pids is not None and limits.pids_max:
        write_control(pids / "pids.max", str(limits.pids_max))
    cpu = dirs.get("cpu")
    if cpu is not None:
        shares = 2 if limits.background else V1_SHARES_PER_DEVICE * max(1, limits.devices)
        _write_if_present(cpu / "cpu.shares", str(shares))
        if limits.cpus > 0:
            _write_if_present(cpu / "cpu.cfs_period_us", str(CFS_PERIOD_US))
            _write_if_present(cpu / "cpu.cfs_quota_us", str(_quota_us(limits.cpus)))


def _quota_us(cpus: float) -> int:
    return max(1000, round(cpus * CFS_PERIOD_US))


def set_own_oom_score_adj(value: int = AGENT_OOM_SCORE_ADJ) -> bool:
    """Lowers this process's OOM score (the host's out-of-memory killer takes tasks first); False
    without the privilege to lower it."""
    try:
        write_control(Path("/proc/self/oom_score_adj"), str(value))
    except OSError:
        return False
    return True


def _safe_name(task_id: str) -> str:
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in task_id)[:64]
    return f"task-{name}"


def _write_if_present(path: Path, text: str) -> None:
    if path.exists():
        write_control(path, text)


def _words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []

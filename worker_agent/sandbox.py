"""How a task's process is confined: bubblewrap namespaces, another uid, or (on a single-user machine) neither.

With bubblewrap (`bwrap`, the sandbox Flatpak uses) each task gets new mount and PID namespaces:
- the system read-only (`/` bound read-only), a fresh `/proc` showing only the task's own processes, a
  minimal `/dev` plus the nodes of the GPUs it was given (found by minor number, worker_agent/gpu_nodes.py)
  and the NVIDIA control devices, a private `/tmp` and `/var/tmp`;
- its job's /dev/shm and IPC namespace, shared with that job's other tasks on this machine and no one
  else's (worker_agent/job_shares.py), so NCCL's shared-memory paths between co-located workers work;
- of the agent's work dir only the task's own directory (its bundle read-only; output, checkpoints, temp
  and home writable), the rest hidden under an empty tmpfs (credential, bundle cache, other tasks);
- the host network, which collectives need.
The Python the agent runs (its prefix, site-packages and mwms's own packages) stays readable even where
an ancestor directory is closed to other users (`/root` holding a pyenv): that ancestor is replaced by an
empty tmpfs and only the needed directories are bound back, read-only.

When the agent is root the task then drops to its own uid with `setpriv` (all capabilities and
supplementary groups dropped; bwrap sets no_new_privs, so setuid files in reach grant nothing).

SIGTERM goes to the task's processes but not to bwrap's monitor (the group leader), which would die of
it and report the task ended while TensorFlow's preemption handler is still saving; SIGKILL after the
grace goes to the whole group, the sandbox's init included, which ends every process inside. Without
`--die-with-parent` a sandbox outlives a crashed agent like an unsandboxed task does, and the next
agent process stops it (worker_agent/agent_state.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import mwms
import mwms_runtime
from mwms import agent_defaults
from mwms.worker_agent import landlock, seccomp
from mwms.worker_agent.cgroups import TaskCgroup
from mwms.worker_agent.gpu_nodes import DriverPaths, GpuNode, control_device_paths
from mwms.worker_agent.job_shares import JobShare
from mwms.worker_agent.stacks import HANDLER_DIR
from mwms.worker_agent.task_env import TaskPaths
from mwms.worker_agent.task_users import TaskIdentity, TaskUsers

log = logging.getLogger("mwms.agent.sandbox")

SANDBOX_MODES = agent_defaults.SANDBOX_MODES
PRIVATE_TEMP_DIRS = ("/tmp", "/var/tmp")
PROBE_TIMEOUT_S = 20.0


class SandboxError(Exception):
    """The requested confinement cannot be had here; the message says what to install or change."""


@dataclass(frozen=True)
class Launch:
    """How to spawn one task process: the argv, and the uid/gid Popen switches to (None: no switch)."""

    argv: list[str]
    user: int | None = None
    group: int | None = None
    # SIGTERM to the group except its leader (bwrap's monitor); see the module docstring.
    spare_leader: bool = False


def find_bwrap(requested: str) -> str | None:
    """The bwrap executable for `requested` ("auto", "bwrap", "off"), checked to work; None: no sandbox."""
    if requested == "off":
        return None
    executable = shutil.which("bwrap")
    if executable is None:
        if requested == "bwrap":
            raise SandboxError(
                "--sandbox bwrap: bubblewrap is not installed; install it (Debian/Ubuntu: "
                "`apt-get install bubblewrap`) or choose --sandbox off"
            )
        log.warning(
            "bubblewrap (bwrap) is not installed: tasks run without a sandbox and can see this machine's "
            "files and processes as far as their user may; install it (`apt-get install bubblewrap`)"
        )
        return None
    why = _probe(executable)
    if why:
        message = f"bubblewrap cannot create a sandbox here: {why}"
        if os.geteuid() != 0:
            message += " (as a user other than root it needs unprivileged user namespaces)"
        if requested == "bwrap":
            raise SandboxError(f"--sandbox bwrap: {message}")
        log.warning("%s; tasks run without a sandbox", message)
        return None
    return executable


def _probe(executable: str) -> str:
    """Why bwrap cannot start a sandbox like a task's, or "" when it can."""
    argv = [executable, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
    argv += ["--unshare-pid", "--unshare-ipc", "--die-with-parent", "--", "/bin/true"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    return "" if done.returncode == 0 else (done.stderr.strip()[-300:] or f"exit code {done.returncode}")


def needed_paths() -> list[Path]:
    """What a task must read of the agent's installation: the interpreter, its packages, mwms's own."""
    found = [Path(p) for p in (sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix)]
    found += [Path(p) for p in sys.path if p and os.path.isabs(p)]
    found += [Path(mwms.__file__).parent, Path(mwms_runtime.__file__).parent, HANDLER_DIR]
    real = {Path(os.path.realpath(p)) for p in found if os.path.isdir(p)}
    # A directory inside another one of the list comes along with it.
    return sorted(p for p in real if not any(o != p and o in p.parents for o in real))


def closed_ancestor(path: Path) -> Path | None:
    """The highest directory above `path` (or `path` itself) that other users may not enter, if any."""
    for candidate in [*reversed(path.parents), path]:
        if candidate == Path("/"):
            continue
        try:
            if not os.stat(candidate).st_mode & stat.S_IXOTH:
                return candidate
        except OSError:
            return None
    return None


class Confinement:
    """Builds each task's launch: the sandbox around it and the identity it runs as."""

    def __init__(
        self, work_dir: Path, users: TaskUsers, bwrap: str | None, driver: DriverPaths | None = None
    ) -> None:
        self.work_dir = Path(os.path.realpath(work_dir))
        self.users = users
        self.bwrap = bwrap
        self.driver = driver or DriverPaths()
        self._setpriv = shutil.which("setpriv") if os.geteuid() == 0 else None
        # Enters a job's shared IPC namespace (util-linux, like setpriv); only root can make one.
        self._nsenter = shutil.which("nsenter") if os.geteuid() == 0 else None
        self._needed = needed_paths()
        # The syscall filter every sandboxed task runs under (worker_agent/seccomp.py), where it can be had.
        self.seccomp = bwrap is not None and _seccomp_works(bwrap)
        # Directories above the needed ones that task users may not enter (found once: they are masked
        # and the needed dirs bound back in every sandbox, or refused at start without one).
        self._closed = sorted({a for a in map(closed_ancestor, self._needed) if a is not None})
        if bwrap and os.geteuid() == 0 and not users.shared_with_agent and self._setpriv is None:
            raise SandboxError("setpriv (util-linux) is not installed: it drops a sandboxed task to its uid")
        if not bwrap and not users.shared_with_agent:
            if self._closed:
                raise SandboxError(
                    f"tasks run as other users, who cannot reach this agent's Python: {self._closed[0]} is "
                    "closed to them; install bubblewrap (its sandbox makes the Python reachable), or "
                    "install mwms where every user can read it (e.g. a venv under /opt)"
                )
            # Task users enter (not list) the work dir on their way to their own task dir.
            os.chmod(self.work_dir, 0o711)

    def describe(self) -> str:
        """Who tasks run as and how they are confined, for the log and the agent list."""
        where = (
            "in a bubblewrap sandbox (own mount and PID namespaces; /dev/shm and IPC shared by a job's "
            "tasks on this machine alone)"
            if self.bwrap
            else "without a sandbox"
        )
        return f"{self.users.describe()}; {where}"

    def label(self) -> str:
        """A few words for the agent list (`mwms agents`): the sandbox and whose identity tasks have."""
        sandbox = "bwrap sandbox" if self.bwrap else "no sandbox"
        if self.users.shared_with_agent:
            return f"{sandbox}; tasks share the agent's user"
        return f"{sandbox}; {'a uid per job' if self.users.per_task else 'one task user'}"

    @property
    def sandboxed(self) -> bool:
        return self.bwrap is not None

    def launch(
        self,
        command: list[str],
        paths: TaskPaths,
        identity: TaskIdentity,
        gpus: Sequence[GpuNode],
        readable: Sequence[Path] = (),
        share: JobShare | None = None,
        cgroup: TaskCgroup | None = None,
        scope_sockets: bool = False,
    ) -> Launch:
        """How to spawn `command` for the task of `paths` as `identity` with its GPUs; `readable`: more
        directories the task reads (its job's own environment and that environment's interpreter);
        `share`: the /dev/shm and IPC namespace the job's tasks on this machine share
        (worker_agent/job_shares.py); `cgroup`: the task's own (worker_agent/cgroups.py), which it joins
        before anything of it runs; its memory limit also sizes the private temp dirs; `scope_sockets`:
        host abstract unix sockets out of its reach (worker_agent/landlock.py)."""
        if scope_sockets:
            command = [*landlock.shim_argv(), *command]
        switch = not identity.shared
        join = cgroup.join_argv() if cgroup is not None else []
        if self.bwrap is None:
            if join and switch and self._setpriv is not None:
                # The join needs root: the drop to the task's uid comes after it (umask as Popen's).
                return Launch([*join, *self._drop_to(identity, umask=True), *command])
            return Launch(
                [*join, *command], identity.uid if switch else None, identity.gid if switch else None
            )
        tmpfs_bytes = cgroup.limits.memory_bytes if cgroup is not None else 0
        argv = [*join, *self._enter(share)]
        argv += [self.bwrap, *self.mounts(paths, gpus, readable, share, tmpfs_bytes)]
        argv += self._unshare(share)
        argv += self._filter()
        argv += ["--chdir", str(paths.bundle_dir), "--"]
        return Launch([*argv, *self._drop_to(identity), *command], spare_leader=True)

    def probe_argv(self, command: list[str], identity: TaskIdentity, gpus: Sequence[GpuNode]) -> list[str]:
        """A sandbox like a task's, without a task dir, for the agent's own check of what a task sees
        (worker_agent/gpu_probe.py): the directory of `command`'s program stays readable."""
        assert self.bwrap is not None, "no sandbox to probe"
        program = Path(os.path.realpath(command[0]))
        args = self._system_mounts([program.parent], None)
        args += ["--perms", "0755", "--tmpfs", str(self.work_dir)]
        args += self._device_binds(gpus)
        argv = [self.bwrap, *args, "--unshare-pid", "--unshare-ipc", *self._filter(), "--chdir", "/", "--"]
        return [*argv, *self._drop_to(identity), *command]

    def _filter(self) -> list[str]:
        """bwrap's seccomp option, its fd filled in at each spawn (seccomp.filled_argv)."""
        return ["--seccomp", seccomp.FD_PLACEHOLDER] if self.seccomp else []

    def _drop_to(self, identity: TaskIdentity, umask: bool = False) -> list[str]:
        """setpriv's options that drop a sandboxed process to `identity` ([] for the agent's own);
        `umask`: the files it creates closed to others, as an unsandboxed task's are."""
        if identity.shared:
            return []
        assert self._setpriv is not None
        prefix = ["/bin/sh", "-c", 'umask 077 && exec "$@"', "mwms-umask"] if umask else []
        return [
            *prefix,
            self._setpriv,
            f"--reuid={identity.uid}",
            f"--regid={identity.gid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
        ]

    def _enter(self, share: JobShare | None) -> list[str]:
        """nsenter into the job's IPC namespace, where it has one (bwrap then makes no new one)."""
        if share is None or share.ipc_namespace is None:
            return []
        assert self._nsenter is not None
        return [self._nsenter, f"--ipc={share.ipc_namespace}", "--"]

    @staticmethod
    def _unshare(share: JobShare | None) -> list[str]:
        if share is not None and share.ipc_namespace is not None:
            return ["--unshare-pid"]
        return ["--unshare-pid", "--unshare-ipc"]

    def mounts(
        self,
        paths: TaskPaths,
        gpus: Sequence[GpuNode] = (),
        readable: Sequence[Path] = (),
        share: JobShare | None = None,
        tmpfs_bytes: int = 0,
    ) -> list[str]:
        """bwrap's mount options for one task, in the order they must be applied; `tmpfs_bytes`: the size
        of its private temp dirs (0: the kernel's default, half the machine's memory)."""
        args = self._system_mounts(readable, share.shm_dir if share is not None else None, tmpfs_bytes)
        extra = sorted({Path(os.path.realpath(p)) for p in readable}, key=lambda p: len(p.parts))
        # Hidden again in case one of the binds above holds the work dir.
        args += ["--perms", "0755", "--tmpfs", str(self.work_dir)]
        task_dir = Path(os.path.realpath(paths.task_dir))
        args += _dirs_between([self.work_dir], task_dir)
        args += ["--bind", str(task_dir), str(task_dir)]
        args += ["--ro-bind", str(task_dir / paths.bundle_dir.name), str(task_dir / paths.bundle_dir.name)]
        checkpoints = Path(os.path.realpath(paths.checkpoint_dir))
        if task_dir not in checkpoints.parents:  # a shared checkpoint filesystem of the operator's
            args += ["--bind", str(checkpoints), str(checkpoints)]
        for path in extra:
            if self.work_dir in path.parents:
                args += _dirs_between([self.work_dir, task_dir], path)
                args += ["--ro-bind", str(path), str(path)]
        args += self._device_binds(gpus)
        return args

    def _system_mounts(
        self, readable: Sequence[Path], shm_dir: Path | None, tmpfs_bytes: int = 0
    ) -> list[str]:
        """The system read-only, fresh /proc and /dev, /dev/shm (the job's, else a fresh one), private
        temp dirs, the work dir and closed dirs hidden, and the agent's Python and `readable` bound back
        where a mask hid them (those under the work dir excepted: the caller binds them after it)."""
        args = ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
        # POSIX semaphores and shared memory (multiprocessing, NCCL) need a writable /dev/shm.
        if shm_dir is not None:
            args += ["--bind", str(shm_dir), "/dev/shm"]
        else:
            args += [*_sized(tmpfs_bytes), "--perms", "1777", "--tmpfs", "/dev/shm"]
        masks = [Path(p) for p in PRIVATE_TEMP_DIRS if os.path.isdir(p)]
        masks += self._closed
        masks.append(self.work_dir)
        masks = sorted(set(masks), key=lambda p: len(p.parts))
        for mask in masks:
            args += _dirs_between(masks, mask)
            private = str(mask) in PRIVATE_TEMP_DIRS
            # A private temp dir's pages count against the task's memory limit; its size is the limit.
            size = _sized(tmpfs_bytes) if private else []
            args += [*size, "--perms", "1777" if private else "0755", "--tmpfs", str(mask)]
        for needed in self._needed:
            if any(m == needed or m in needed.parents for m in masks):
                args += _dirs_between(masks, needed)
                args += ["--ro-bind", str(needed), str(needed)]
        # Read-only, where the masks hid them: the job's own environment is bound after the work dir's.
        extra = sorted({Path(os.path.realpath(p)) for p in readable}, key=lambda p: len(p.parts))
        for path in extra:
            if self.work_dir not in path.parents and any(m == path or m in path.parents for m in masks):
                args += _dirs_between(masks, path)
                args += ["--ro-bind", str(path), str(path)]
        return args

    def _device_binds(self, gpus: Sequence[GpuNode]) -> list[str]:
        """The nodes of exactly these GPUs, at /dev/nvidia<minor>, and the NVIDIA control devices."""
        if not gpus:
            return []
        args: list[str] = []
        for gpu in gpus:
            source = gpu.source(self.driver)
            if source is None or not os.path.exists(source):
                raise SandboxError(f"GPU {gpu.index} ({gpu.uuid}) has no device node to bind ({source})")
            args += ["--dev-bind", str(source), gpu.node]
        for source, target in control_device_paths(self.driver):
            args += ["--dev-bind", str(source), str(target)]
        return args


def _seccomp_works(bwrap: str) -> bool:
    """Whether tasks can run under the seccomp filter here: libseccomp builds it and bwrap installs it."""
    why = seccomp.available()
    if not why:
        argv = [bwrap, "--ro-bind", "/", "/", "--seccomp", seccomp.FD_PLACEHOLDER, "--", "/bin/true"]
        try:
            with seccomp.filled_argv(argv) as (filled, fds):
                done = subprocess.run(
                    filled, pass_fds=fds, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S
                )
            why = "" if done.returncode == 0 else f"bwrap refused it: {done.stderr.strip()[-200:]}"
        except (OSError, subprocess.TimeoutExpired, seccomp.SeccompError) as error:
            why = str(error)
    if why:
        log.warning(
            "tasks run without a seccomp filter (user namespaces, keyrings and io_uring stay open to them): %s; "
            "install libseccomp2",
            why,
        )
        return False
    return True


def _sized(tmpfs_bytes: int) -> list[str]:
    """bwrap's size option for the next tmpfs ([] for the kernel's default)."""
    return ["--size", str(tmpfs_bytes)] if tmpfs_bytes > 0 else []


def _dirs_between(masks: list[Path], target: Path) -> list[str]:
    """`--dir` options for the directories between the mask that covers `target` and `target` itself."""
    covering = [m for m in masks if m in target.parents]
    if not covering:
        return []
    top = max(covering, key=lambda p: len(p.parts))
    args: list[str] = []
    for directory in reversed(target.parents):
        if top in directory.parents:
            args += ["--perms", "0755", "--dir", str(directory)]
    return args

"""What the sandboxed tasks of one job on this machine share: one /dev/shm and one IPC namespace.

Two workers of a job on one machine talk through NCCL, whose fast paths between processes of a host go
through shared memory files in /dev/shm and CUDA IPC, closed to workers that each have a private /dev/shm
and IPC namespace. So every sandboxed task of a job gets the job's own:
- /dev/shm: a directory on the host's /dev/shm (memory, like the private tmpfs it replaces), under a
  directory of this agent's closed to everyone else (0700), bound at /dev/shm in each of the job's sandboxes;
- an IPC namespace (System V and POSIX message queues, semaphores), kept alive by a bind mount of its nsfs
  file (`unshare --ipc=FILE`), which each task enters with `nsenter` before bubblewrap starts.
Both are made with the job's first task here and removed with its last; another job's tasks never see
them. Only root can make a namespace: an agent of another user shares /dev/shm only. What a crashed agent
left is removed by the next one (`clean_stale`).

The job's tasks here also share one uid (worker_agent/task_users.py): NCCL makes its shared memory files
readable by their owner alone.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("mwms.agent.job_shares")

HOST_SHM = Path("/dev/shm")
UNSHARE_TIMEOUT_S = 10.0
# Job ids come from the coordinator; these are the characters it uses (a safe file name either way).
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


@dataclass(frozen=True)
class JobShare:
    """The job's /dev/shm directory on this machine and its IPC namespace file (None: none shared)."""

    job_id: str
    shm_dir: Path
    ipc_namespace: Path | None


class JobShares:
    """Makes a job's share with its first task on this agent and removes it with its last."""

    def __init__(self, work_dir: Path, shm_root: Path | None = None) -> None:
        tag = hashlib.sha256(str(Path(os.path.realpath(work_dir))).encode()).hexdigest()[:12]
        # One agent's shares apart from another's on the same host (two work dirs).
        host_shm = HOST_SHM if HOST_SHM.is_dir() and os.access(HOST_SHM, os.W_OK) else work_dir
        self.shm_root = shm_root or host_shm / f"mwms-agent-{tag}"
        self.ns_root = work_dir / "ipc-namespaces"
        self._unshare = shutil.which("unshare") if os.geteuid() == 0 else None
        self._lock = threading.Lock()
        self._holders: dict[str, set[str]] = {}
        self._shares: dict[str, JobShare] = {}
        self._warned = False

    def clean_stale(self) -> None:
        """Removes what an earlier agent process on this work dir left (its tasks have been stopped)."""
        if self.ns_root.is_dir():
            for entry in self.ns_root.iterdir():
                _remove_namespace(entry)
        shutil.rmtree(self.shm_root, ignore_errors=True)

    def acquire(self, job_id: str, task_id: str, uid: int, gid: int) -> JobShare:
        """The job's share, made now for its first task here; /dev/shm is `uid`'s (the job's tasks')."""
        if not job_id or not set(job_id) <= _SAFE:
            raise ValueError(f"job id {job_id!r} cannot name a directory")
        with self._lock:
            share = self._shares.get(job_id)
            if share is None:
                share = self._make(job_id, uid, gid)
                self._shares[job_id] = share
            self._holders.setdefault(job_id, set()).add(task_id)
            return share

    def release(self, job_id: str, task_id: str) -> None:
        """The task has ended: with the job's last task here, its share goes."""
        with self._lock:
            holders = self._holders.get(job_id)
            if holders is None or task_id not in holders:
                return
            holders.discard(task_id)
            if holders:
                return
            del self._holders[job_id]
            share = self._shares.pop(job_id)
        shutil.rmtree(share.shm_dir, ignore_errors=True)
        if share.ipc_namespace is not None:
            _remove_namespace(share.ipc_namespace)

    def _make(self, job_id: str, uid: int, gid: int) -> JobShare:
        self.shm_root.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.shm_root, 0o700)
        shm_dir = self.shm_root / job_id
        shutil.rmtree(shm_dir, ignore_errors=True)
        shm_dir.mkdir(mode=0o700)
        if (uid, gid) != (os.geteuid(), os.getegid()):
            os.chown(shm_dir, uid, gid)
        return JobShare(job_id, shm_dir, self._make_namespace(job_id))

    def _make_namespace(self, job_id: str) -> Path | None:
        if self._unshare is None:
            if not self._warned:
                self._warned = True
                log.info(
                    "a job's tasks on this machine share /dev/shm but not an IPC namespace: only an agent "
                    "started as root can make one"
                )
            return None
        self.ns_root.mkdir(mode=0o700, exist_ok=True)
        path = self.ns_root / job_id
        _remove_namespace(path)
        path.touch(mode=0o600)
        done = subprocess.run(
            [self._unshare, f"--ipc={path}", "true"],
            capture_output=True,
            text=True,
            timeout=UNSHARE_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            log.warning(
                "cannot make an IPC namespace for job %s (%s): its tasks here get one each",
                job_id,
                done.stderr.strip()[-200:] or f"exit code {done.returncode}",
            )
            path.unlink(missing_ok=True)
            return None
        return path


def _remove_namespace(path: Path) -> None:
    """Unmounts a namespace file (the namespace ends with its last process) and removes it."""
    umount = shutil.which("umount")
    if umount is not None and path.exists():
        subprocess.run([umount, str(path)], capture_output=True, timeout=UNSHARE_TIMEOUT_S, check=False)
    try:
        path.unlink()
    except OSError:
        pass

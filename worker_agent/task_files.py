"""Reading, packing and handing over the files a task can write, without trusting what it left there.

A task owns its output, checkpoint, stacks and temp directories and may put symlinks anywhere in them
(to the agent's credential, say). The agent is root, so it must never follow one: every read goes
through directory file descriptors opened with O_NOFOLLOW, component by component from the task dir
(whose parent only the agent can write), and packing walks with `os.fwalk`, which never follows links.
Archives the agent writes go to its own scratch dir, never into the task's.
"""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path

NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
NOFOLLOW_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UnsafeTaskFile(OSError):
    """A task file is a link, a device or a fifo instead of what the agent expects."""


def open_beneath(task_dir: Path, path: Path) -> int:
    """A read-only fd of the regular file `path` inside `task_dir`, no link followed on the way."""
    relative = path.relative_to(task_dir)
    fd = os.open(task_dir, NOFOLLOW_DIR)
    try:
        for part in relative.parts[:-1]:
            inner = os.open(part, NOFOLLOW_DIR, dir_fd=fd)
            os.close(fd)
            fd = inner
        file_fd = os.open(relative.parts[-1], NOFOLLOW_FILE, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(file_fd).st_mode):
        os.close(file_fd)
        raise UnsafeTaskFile(f"{path} is not a regular file")
    return file_fd


def read_beneath(task_dir: Path, path: Path, limit: int, offset: int = 0) -> bytes:
    """Up to `limit` bytes of `path` (inside `task_dir`) from `offset`; links are refused."""
    fd = open_beneath(task_dir, path)
    try:
        return os.pread(fd, limit, offset)
    finally:
        os.close(fd)


def pack_beneath(
    task_dir: Path, directory: Path, archive: Path, skip_top: Callable[[str], bool] = lambda name: False
) -> int:
    """Writes the regular files and dirs under `directory` (inside `task_dir`) to the tar.gz `archive`.

    Links, devices and fifos are left out; top-level entries for which `skip_top(name)` is true too.
    Returns the number of files packed.
    """
    relative = directory.relative_to(task_dir)
    top = os.open(task_dir, NOFOLLOW_DIR)
    try:
        for part in relative.parts:
            inner = os.open(part, NOFOLLOW_DIR, dir_fd=top)
            os.close(top)
            top = inner
        count = 0
        with tarfile.open(archive, "w:gz") as tar:
            for root, dirs, files, root_fd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
                if root == ".":
                    dirs[:] = sorted(d for d in dirs if not skip_top(d))
                    files = [f for f in files if not skip_top(f)]
                else:
                    dirs.sort()
                for name in dirs:
                    info = _info(os.path.normpath(os.path.join(root, name)), name, root_fd)
                    if info is not None and info.isdir():
                        tar.addfile(info)
                for name in sorted(files):
                    count += _add_file(tar, os.path.normpath(os.path.join(root, name)), name, root_fd)
        return count
    finally:
        os.close(top)


def _info(arcname: str, name: str, dir_fd: int) -> tarfile.TarInfo | None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    info = tarfile.TarInfo(arcname)
    info.mtime = int(st.st_mtime)
    info.mode = stat.S_IMODE(st.st_mode) & 0o755
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
        return info
    if stat.S_ISREG(st.st_mode):
        info.size = st.st_size
        return info
    return None  # links, devices, fifos, sockets


def _add_file(tar: tarfile.TarFile, arcname: str, name: str, dir_fd: int) -> int:
    try:
        fd = os.open(name, NOFOLLOW_FILE, dir_fd=dir_fd)
    except OSError:
        return 0  # a link (ELOOP), gone, or unreadable: not packed
    with os.fdopen(fd, "rb") as file:
        st = os.fstat(file.fileno())
        if not stat.S_ISREG(st.st_mode):
            return 0
        info = tarfile.TarInfo(arcname)
        info.mtime, info.mode = int(st.st_mtime), stat.S_IMODE(st.st_mode) & 0o755
        info.size = st.st_size  # a file that shrinks meanwhile fails the packing (OSError): retried later
        tar.addfile(info, file)
    return 1


def hand_over(directory: Path, uid: int, gid: int) -> None:
    """Makes `directory` and everything under it belong to `uid`:`gid` (no link followed)."""
    os.chown(directory, uid, gid, follow_symlinks=False)
    for _root, dirs, files, root_fd in os.fwalk(directory, follow_symlinks=False):
        for name in dirs + files:
            os.chown(name, uid, gid, dir_fd=root_fd, follow_symlinks=False)

"""The seccomp filter a sandboxed task runs under: bubblewrap installs it (`--seccomp FD`) after its own setup.

bwrap reads a compiled classic-BPF program (an array of `struct sock_filter`) from the fd and installs it
last, just before it executes the command, so its own namespace and mount setup is unaffected; setpriv,
which then drops the task to its uid, and everything the task starts inherit it (filters cannot be removed).
The filter's rules, and why each syscall is denied or kept, are in worker_agent/seccomp_rules.py; how
the program is built with libseccomp (once per agent process, by syscall name; a name this architecture
lacks is skipped, `skipped()`), and how other ABIs are handled, in worker_agent/seccomp_build.py.

Use: `available()` says why no filter can be had here ("" when one can: the agent warns at start
otherwise); `task_filter()` is the program's bytes; `filter_fd()` (or the context `filter_file()`) gives a
fresh readable, inheritable fd at offset 0 for one bwrap: pass `bwrap_options(fd)` before bwrap's `--`
and the fd in Popen's `pass_fds`, then close it in the agent. Each bwrap needs its own fd: it reads to
the end, and the offset is shared by every copy of one open file.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mwms.worker_agent.seccomp_build import LIBRARY as LIBRARY
from mwms.worker_agent.seccomp_build import SeccompError as SeccompError
from mwms.worker_agent.seccomp_build import compiled_filter, load_library
from mwms.worker_agent.seccomp_rules import ACT_ALLOW as ACT_ALLOW
from mwms.worker_agent.seccomp_rules import ACT_KILL_PROCESS as ACT_KILL_PROCESS
from mwms.worker_agent.seccomp_rules import ACT_KILL_THREAD as ACT_KILL_THREAD
from mwms.worker_agent.seccomp_rules import AF_ALG as AF_ALG
from mwms.worker_agent.seccomp_rules import AF_VSOCK as AF_VSOCK
from mwms.worker_agent.seccomp_rules import ALLOWED_PERSONALITIES as ALLOWED_PERSONALITIES
from mwms.worker_agent.seccomp_rules import CLONE_NEWUSER as CLONE_NEWUSER
from mwms.worker_agent.seccomp_rules import CMP_EQ as CMP_EQ
from mwms.worker_agent.seccomp_rules import CMP_MASKED_EQ as CMP_MASKED_EQ
from mwms.worker_agent.seccomp_rules import DENIED as DENIED
from mwms.worker_agent.seccomp_rules import NEW_USER_NS as NEW_USER_NS
from mwms.worker_agent.seccomp_rules import Condition as Condition
from mwms.worker_agent.seccomp_rules import Denial as Denial
from mwms.worker_agent.seccomp_rules import action_errno as action_errno

# bwrap reads the program to the end; a pipe (used only where memfd_create fails) must hold it whole.
_PIPE_LIMIT = 65536


def available() -> str:
    """Why no filter can be had here ("" when it can): libseccomp missing or too old, no seccomp in the
    kernel. The agent says it at start and runs tasks without the filter."""
    if not os.path.exists("/proc/self/status"):
        return "/proc is not mounted; seccomp cannot be checked"
    try:
        with open("/proc/self/status") as status:
            if not any(line.startswith("Seccomp:") for line in status):
                return "this kernel was built without seccomp (CONFIG_SECCOMP)"
    except OSError as error:
        return f"/proc/self/status is not readable: {error}"
    try:
        compiled_filter()
    except SeccompError as error:
        return str(error)
    except OSError as error:
        return f"the filter could not be built: {error}"
    return ""


def task_filter() -> bytes:
    """The compiled filter (struct sock_filter[]), built once and cached; SeccompError when it cannot be."""
    return compiled_filter().program


def skipped() -> tuple[str, ...]:
    """Names of the deny list that this architecture (or this libseccomp) does not have."""
    return compiled_filter().skipped


def library_version() -> str:
    """The version of the libseccomp that built the filter (for the agent's log)."""
    return compiled_filter().version


def syscall_number(name: str) -> int | None:
    """The native number of syscall `name`, None when this architecture has no such syscall."""
    number = int(load_library().seccomp_syscall_resolve_name(name.encode()))
    return number if number >= 0 else None


def filter_fd() -> int:
    """A new fd holding the filter, at offset 0, inheritable, for one bwrap's `--seccomp FD`: the caller
    passes it in Popen's pass_fds and closes it once the process has started. A sealed memfd (a pipe
    where memfd_create fails)."""
    program = task_filter()
    try:
        fd = os.memfd_create("mwms-seccomp", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError:
        return _pipe_with(program)
    try:
        view = memoryview(program)
        while view:
            view = view[os.write(fd, view) :]
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        os.lseek(fd, 0, os.SEEK_SET)
        os.set_inheritable(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _pipe_with(program: bytes) -> int:
    if len(program) >= _PIPE_LIMIT:
        raise SeccompError(f"the filter ({len(program)} bytes) does not fit a pipe and memfd_create failed")
    read_end, write_end = os.pipe()
    try:
        view = memoryview(program)
        while view:
            view = view[os.write(write_end, view) :]
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    os.set_inheritable(read_end, True)
    return read_end


@contextmanager
def filter_file() -> Iterator[int]:
    """filter_fd() for the duration of a `with` block (the spawn), closed after it."""
    fd = filter_fd()
    try:
        yield fd
    finally:
        os.close(fd)


def bwrap_options(fd: int) -> list[str]:
    """bwrap's options that install the filter read from `fd` (before bwrap's `--`)."""
    return ["--seccomp", str(fd)]


# Stands for the filter's fd in an argv built before the spawn (worker_agent/sandbox.py): each bwrap
# reads its fd to the end, so every spawn gets a fresh one (`filled_argv`).
FD_PLACEHOLDER = "{mwms-seccomp-fd}"


@contextmanager
def filled_argv(argv: list[str]) -> Iterator[tuple[list[str], tuple[int, ...]]]:
    """`argv` with FD_PLACEHOLDER replaced by a fresh fd holding the filter, and the fds to pass the
    spawn (none when `argv` holds no placeholder); the fd is closed after the `with` block."""
    if FD_PLACEHOLDER not in argv:
        yield argv, ()
        return
    with filter_file() as fd:
        yield [str(fd) if word == FD_PLACEHOLDER else word for word in argv], (fd,)


def run_filled(argv: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
    """subprocess.run of `argv` with its filter fd filled in (`filled_argv`); `options` as run's."""
    with filled_argv(argv) as (filled, fds):
        return subprocess.run(filled, pass_fds=fds, **options)

"""The seccomp filter a sandboxed task runs under: bubblewrap installs it (`--seccomp FD`) after its own setup.

bwrap reads a compiled classic-BPF program (an array of `struct sock_filter`) from the fd and installs it
last, just before it executes the command, so its own namespace and mount setup is unaffected; setpriv,
which then drops the task to its uid, and everything the task starts inherit it (filters cannot be removed).
The program is built with libseccomp (through ctypes: there is no well-kept Python binding on PyPI),
once per agent process, by syscall *name*: libseccomp resolves each name for the machine's own
architecture, and a name that architecture lacks (vm86 or stime on x86_64) is skipped (`skipped()`).

The default action is ALLOW with a deny list, which has the effect of Docker's default profile where it
matters here without an allow list to keep up with every syscall TensorFlow, NCCL and CUDA use. Denied
(EPERM unless said otherwise):
- new user namespaces, the usual first step of a kernel exploit from an unprivileged process (a user
  namespace hands its creator every capability inside it): `unshare` and `clone` with CLONE_NEWUSER,
  `clone3` entirely with ENOSYS (its flags lie in memory that seccomp cannot read; glibc then falls back
  to `clone`, whose flags are checked), `setns`. Other namespace flags stay allowed: they need
  CAP_SYS_ADMIN, which a task that setpriv dropped does not have;
- the kernel keyrings (`add_key`, `keyctl`, `request_key`): not namespaced, a long record of bugs;
- io_uring (`io_uring_setup`, `io_uring_enter`, `io_uring_register`): a large share of recent kernel
  exploits, and its operations bypass syscall filtering; Docker denies it too;
- mounts and the filesystem view: `mount`, `umount`, `umount2`, `pivot_root`, `chroot`, the new mount
  API (`open_tree`, `move_mount`, `mount_setattr`, `fsopen`, `fsconfig`, `fsmount`, `fspick`), file
  handles (`open_by_handle_at`, the "shocker" escape, and `name_to_handle_at`);
- the kernel and the machine: `bpf`, `perf_event_open`, modules (`init_module`, `finit_module`,
  `delete_module`, `create_module`, `query_module`, `get_kernel_syms`), `kexec_load`, `kexec_file_load`,
  `reboot`, `swapon`, `swapoff`, `acct`, `quotactl`, `quotactl_fd`, `nfsservctl`, `lookup_dcookie`,
  `syslog`, `sysfs`, `_sysctl`, `uselib`, `userfaultfd` (an exploitation aid), `fanotify_init`, `iopl`,
  `ioperm`, `vm86`, `vm86old`;
- the host's clock and name (a task shares the host's UTS namespace): `settimeofday`, `clock_settime`,
  `clock_settime64`, `stime`, `sethostname`, `setdomainname`. `adjtimex` and `clock_adjtime` stay
  allowed as in Docker: reading the clock's state is harmless and changing it needs CAP_SYS_TIME;
- `personality` with any value but PER_LINUX (0), PER_LINUX32 (8), UNAME26 (0x20000), their union
  and the query 0xffffffff (Docker's list): ADDR_NO_RANDOMIZE would turn off ASLR for what the task
  executes, READ_IMPLIES_EXEC makes every readable mapping executable. libseccomp cannot say "none of
  these values" in one rule, so that check is a few hand-written BPF instructions put before
  libseccomp's program (`_personality_prefix`); it compares the low 32 bits, all the kernel reads;
- `socket` of the families AF_ALG (the kernel's crypto API, with its own record of bugs) and AF_VSOCK
  (host/guest sockets, not per network namespace), which Docker's profile also refuses;
- `ptrace`. The agent takes a task's Python stacks (worker_agent/stacks.py) with py-spy run by the
  agent itself, outside the sandbox and outside this filter, or with the faulthandler that the task's
  own sitecustomize installs, answering a signal: neither makes the task call ptrace. Docker allows
  ptrace on kernels >= 4.8 (where it can no longer bypass seccomp); it is denied here all the same
  because nothing a training task runs needs it, it is a frequent part of local exploits, and a task's
  processes share a uid with its job's other tasks. The cost: gdb, strace or py-spy run *inside* a
  task fail. `process_vm_readv` and `process_vm_writev` stay allowed: MPI's and UCX's single-copy
  shared-memory transports (CMA) use them, and they carry ptrace's own permission check.

Kept on purpose: the NUMA calls (`mbind`, `get_mempolicy`, `set_mempolicy`, `set_mempolicy_home_node`,
`migrate_pages`, `move_pages`), which TensorFlow, NCCL and CUDA's allocators use to place memory near a
GPU (Docker denies them without CAP_SYS_NICE); `vmsplice`, `memfd_create`, SysV and POSIX IPC,
`sched_setaffinity`, `seccomp` itself (a process may add filters, never remove one), `kcmp`,
`pidfd_getfd`, `io_setup` and the rest of libaio.

Architectures: the filter holds the machine's native ABI alone. A syscall made through another ABI the
kernel accepts (the 32-bit x86 `int 0x80` entry or x32 on x86_64, AArch32 on arm64) would use other
numbers and slip past a name-based list, so libseccomp's "bad architecture" action applies to it:
KILL_PROCESS (the process dies of SIGSYS, "Bad system call"; KILL_THREAD where the kernel predates 4.14).
Returning EPERM instead would leave a 32-bit program spinning on failed exits; no TensorFlow task runs
one. On x86_64 libseccomp's program also sends every x32 number (bit 30 set) to that action.

Use: `available()` says why no filter can be had here ("" when one can: the agent warns at start
otherwise); `task_filter()` is the program's bytes; `filter_fd()` (or the context `filter_file()`) gives a
fresh readable, inheritable fd at offset 0 for one bwrap: pass `bwrap_options(fd)` before bwrap's `--`
and the fd in Popen's `pass_fds`, then close it in the agent. Each bwrap needs its own fd: it reads to
the end, and the offset is shared by every copy of one open file.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import functools
import os
import platform
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

LIBRARY = "libseccomp.so.2"

# libseccomp's action values (seccomp.h): the kernel's SECCOMP_RET_* values.
ACT_KILL_PROCESS = 0x80000000
ACT_KILL_THREAD = 0x00000000
ACT_ALLOW = 0x7FFF0000
_ACT_ERRNO = 0x00050000

# enum scmp_filter_attr and enum scmp_compare.
_ATTR_ACT_BADARCH = 2
CMP_EQ = 4
CMP_MASKED_EQ = 7

CLONE_NEWUSER = 0x10000000
AF_ALG = 38
AF_VSOCK = 40
# personality(2) values Docker's profile allows: PER_LINUX, PER_LINUX32, UNAME26, both, and the query.
ALLOWED_PERSONALITIES = (0x0, 0x0008, 0x20000, 0x20008, 0xFFFFFFFF)

# The argument holding clone's flags: the first, except on s390 (the second).
_CLONE_FLAGS_ARG = 1 if platform.machine().startswith("s390") else 0

# bwrap reads the program to the end; a pipe (used only where memfd_create fails) must hold it whole.
_PIPE_LIMIT = 65536


def action_errno(code: int) -> int:
    """SCMP_ACT_ERRNO(code): the syscall fails with `code` and does nothing."""
    return _ACT_ERRNO | (code & 0xFFFF)


class SeccompError(Exception):
    """No filter can be built here; the message says why (libseccomp missing, a rule refused)."""


@dataclass(frozen=True)
class Condition:
    """One comparison of a syscall argument: `(arg[index] & mask) == value` for CMP_MASKED_EQ,
    `arg[index] == value` for CMP_EQ."""

    index: int
    op: int
    value: int
    mask: int = 0


@dataclass(frozen=True)
class Denial:
    """Syscalls refused with `code` (when all of `conditions` hold), and why."""

    names: tuple[str, ...]
    why: str
    code: int = errno.EPERM
    conditions: tuple[Condition, ...] = ()


NEW_USER_NS = Condition(0, CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER)

DENIED: tuple[Denial, ...] = (
    Denial(("unshare",), "a new user namespace", conditions=(NEW_USER_NS,)),
    Denial(
        ("clone",),
        "a new user namespace",
        conditions=(Condition(_CLONE_FLAGS_ARG, CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER),),
    ),
    Denial(("clone3",), "its flags cannot be checked; glibc falls back to clone", code=errno.ENOSYS),
    Denial(("setns",), "entering other namespaces"),
    Denial(("add_key", "keyctl", "request_key"), "the kernel keyrings (not namespaced)"),
    Denial(("io_uring_setup", "io_uring_enter", "io_uring_register"), "io_uring"),
    Denial(
        (
            "mount",
            "umount",
            "umount2",
            "pivot_root",
            "chroot",
            "open_tree",
            "move_mount",
            "mount_setattr",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
        ),
        "mounts and the filesystem view",
    ),
    Denial(("open_by_handle_at", "name_to_handle_at"), "file handles"),
    Denial(
        (
            "bpf",
            "perf_event_open",
            "init_module",
            "finit_module",
            "delete_module",
            "create_module",
            "query_module",
            "get_kernel_syms",
            "kexec_load",
            "kexec_file_load",
            "reboot",
            "swapon",
            "swapoff",
            "acct",
            "quotactl",
            "quotactl_fd",
            "nfsservctl",
            "lookup_dcookie",
            "syslog",
            "sysfs",
            "_sysctl",
            "uselib",
            "userfaultfd",
            "fanotify_init",
            "iopl",
            "ioperm",
            "vm86",
            "vm86old",
        ),
        "the kernel and the machine",
    ),
    Denial(
        ("settimeofday", "clock_settime", "clock_settime64", "stime", "sethostname", "setdomainname"),
        "the host's clock and name",
    ),
    Denial(("socket",), "the kernel crypto API", conditions=(Condition(0, CMP_EQ, AF_ALG),)),
    Denial(("socket",), "host/guest sockets", conditions=(Condition(0, CMP_EQ, AF_VSOCK),)),
    Denial(("ptrace",), "tracing (the agent's stack dumps do not need it inside the task)"),
)


class _ArgCmp(ctypes.Structure):
    """struct scmp_arg_cmp."""

    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


class _Version(ctypes.Structure):
    """struct scmp_version."""

    _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]


@functools.cache
def _load() -> ctypes.CDLL:
    """libseccomp with the prototypes this module calls; SeccompError when it is not installed."""
    names = [LIBRARY]
    found = ctypes.util.find_library("seccomp")
    if found and found not in names:
        names.append(found)
    errors = []
    for name in names:
        try:
            lib = ctypes.CDLL(name, use_errno=True)
            break
        except OSError as error:
            errors.append(str(error))
    else:
        raise SeccompError(
            f"libseccomp is not installed ({'; '.join(errors)}); Debian/Ubuntu: `apt-get install libseccomp2`"
        )
    lib.seccomp_version.restype = ctypes.POINTER(_Version)
    lib.seccomp_version.argtypes = []
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.restype = None
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_attr_set.restype = ctypes.c_int
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_arch_native.restype = ctypes.c_uint32
    lib.seccomp_arch_native.argtypes = []
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.restype = ctypes.c_int
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_export_bpf.restype = ctypes.c_int
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


@dataclass(frozen=True)
class _Compiled:
    program: bytes
    skipped: tuple[str, ...]
    version: str


_lock = threading.Lock()
_compiled: _Compiled | None = None
_failure: str | None = None


def _compile() -> _Compiled:
    """The filter, built once per process (SeccompError, remembered, when it cannot be)."""
    global _compiled, _failure
    with _lock:
        if _compiled is not None:
            return _compiled
        if _failure is not None:
            raise SeccompError(_failure)
        try:
            _compiled = _build(_load())
        except SeccompError as error:
            _failure = str(error)
            raise
        return _compiled


def _build(lib: ctypes.CDLL) -> _Compiled:
    if not sys.platform.startswith("linux"):
        raise SeccompError(f"seccomp is Linux's; this is {sys.platform}")
    version = lib.seccomp_version().contents
    described = f"{version.major}.{version.minor}.{version.micro}"
    if (version.major, version.minor) < (2, 4):
        raise SeccompError(f"libseccomp {described} is too old (2.4 or newer is needed)")
    ctx = lib.seccomp_init(ACT_ALLOW)
    if not ctx:
        raise SeccompError("libseccomp could not create a filter (seccomp_init)")
    try:
        # A syscall made through another ABI than the native one: the process dies of SIGSYS.
        if lib.seccomp_attr_set(ctx, _ATTR_ACT_BADARCH, ACT_KILL_PROCESS) < 0:
            lib.seccomp_attr_set(ctx, _ATTR_ACT_BADARCH, ACT_KILL_THREAD)
        skipped = []
        for denial in DENIED:
            conditions = (_ArgCmp * max(1, len(denial.conditions)))(
                *(_ArgCmp(c.index, c.op, *_data(c)) for c in denial.conditions)
            )
            for name in denial.names:
                number = lib.seccomp_syscall_resolve_name(name.encode())
                if number < 0:  # unknown to libseccomp, or not a syscall of this architecture
                    skipped.append(name)
                    continue
                rc = lib.seccomp_rule_add_array(
                    ctx, action_errno(denial.code), number, len(denial.conditions), conditions
                )
                if rc < 0:
                    raise SeccompError(
                        f"libseccomp {described} refused the rule for {name}: {os.strerror(-rc)}"
                    )
        body = _export(lib, ctx)
    finally:
        lib.seccomp_release(ctx)
    personality = lib.seccomp_syscall_resolve_name(b"personality")
    prefix = b""
    if personality >= 0:
        prefix = _personality_prefix(lib.seccomp_arch_native(), personality)
    else:
        skipped.append("personality")
    return _Compiled(prefix + body, tuple(skipped), described)


def _data(condition: Condition) -> tuple[int, int]:
    """datum_a and datum_b of struct scmp_arg_cmp: the mask first for SCMP_CMP_MASKED_EQ."""
    if condition.op == CMP_MASKED_EQ:
        return condition.mask, condition.value
    return condition.value, 0


def _export(lib: ctypes.CDLL, ctx: int) -> bytes:
    """libseccomp's program as bytes (seccomp_export_bpf writes to an fd; 2.5 has no in-memory export)."""
    fd = os.memfd_create("mwms-seccomp-export", os.MFD_CLOEXEC)
    try:
        rc = lib.seccomp_export_bpf(ctx, fd)
        if rc < 0:
            raise SeccompError(f"libseccomp could not export the filter: {os.strerror(-rc)}")
        size = os.fstat(fd).st_size
        program = os.pread(fd, size, 0)
    finally:
        os.close(fd)
    if not program or len(program) % 8:
        raise SeccompError(f"libseccomp exported {len(program)} bytes, not a BPF program")
    return program


# Classic BPF (linux/filter.h, linux/bpf_common.h) and struct seccomp_data's offsets.
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_NR = 0
_ARCH = 4
_ARG0_LOW = 16 if sys.byteorder == "little" else 20


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    """One struct sock_filter {u16 code; u8 jt; u8 jf; u32 k} in this machine's byte order."""
    return struct.pack("=HBBI", code, jt, jf, k)


def _personality_prefix(arch: int, number: int) -> bytes:
    """Instructions run before libseccomp's program: personality(2) of the native ABI is allowed with
    one of ALLOWED_PERSONALITIES and refused (EPERM) with anything else; every other syscall, and
    every syscall of another ABI, goes on to libseccomp's program (the instruction after this prefix),
    which checks the architecture again. The kernel reads personality's argument as an unsigned int:
    only its low 32 bits are compared."""
    values = ALLOWED_PERSONALITIES
    count = 7 + len(values)  # the prefix's length: jumps below are relative to the next instruction
    program = [
        _insn(_LD_W_ABS, _ARCH),
        _insn(_JEQ_K, arch, 0, count - 2),
        _insn(_LD_W_ABS, _NR),
        _insn(_JEQ_K, number & 0xFFFFFFFF, 0, count - 4),
        _insn(_LD_W_ABS, _ARG0_LOW),
    ]
    for position, value in enumerate(values):
        # Equal: on to the ALLOW at the end (past the other comparisons and the refusal).
        program.append(_insn(_JEQ_K, value, len(values) - position, 0))
    program.append(_insn(_RET_K, action_errno(errno.EPERM)))
    program.append(_insn(_RET_K, ACT_ALLOW))
    assert len(program) == count
    return b"".join(program)


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
        _compile()
    except SeccompError as error:
        return str(error)
    except OSError as error:
        return f"the filter could not be built: {error}"
    return ""


def task_filter() -> bytes:
    """The compiled filter (struct sock_filter[]), built once and cached; SeccompError when it cannot be."""
    return _compile().program


def skipped() -> tuple[str, ...]:
    """Names of the deny list that this architecture (or this libseccomp) does not have."""
    return _compile().skipped


def library_version() -> str:
    """The version of the libseccomp that built the filter (for the agent's log)."""
    return _compile().version


def syscall_number(name: str) -> int | None:
    """The native number of syscall `name`, None when this architecture has no such syscall."""
    number = int(_load().seccomp_syscall_resolve_name(name.encode()))
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

"""Building the seccomp filter (worker_agent/seccomp.py) from its rules (worker_agent/seccomp_rules.py):
libseccomp through ctypes, the compiled program cached per process, and the hand-written BPF prefix
that checks personality(2).

The program is built with libseccomp (through ctypes: there is no well-kept Python binding on PyPI),
once per agent process, by syscall *name*: libseccomp resolves each name for the machine's own
architecture, and a name that architecture lacks (vm86 or stime on x86_64) is skipped.

Architectures: the filter holds the machine's native ABI alone. A syscall made through another ABI the
kernel accepts (the 32-bit x86 `int 0x80` entry or x32 on x86_64, AArch32 on arm64) would use other
numbers and slip past a name-based list, so libseccomp's "bad architecture" action applies to it:
KILL_PROCESS (the process dies of SIGSYS, "Bad system call"; KILL_THREAD where the kernel predates 4.14).
Returning EPERM instead would leave a 32-bit program spinning on failed exits; no TensorFlow task runs
one. On x86_64 libseccomp's program also sends every x32 number (bit 30 set) to that action.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import struct
import sys
import threading
from dataclasses import dataclass

from mwms.worker_agent.seccomp_rules import (
    ACT_ALLOW,
    ACT_KILL_PROCESS,
    ACT_KILL_THREAD,
    ALLOWED_PERSONALITIES,
    CMP_MASKED_EQ,
    DENIED,
    Condition,
    action_errno,
)

LIBRARY = "libseccomp.so.2"

# enum scmp_filter_attr.
_ATTR_ACT_BADARCH = 2


class SeccompError(Exception):
    """No filter can be built here; the message says why (libseccomp missing, a rule refused)."""


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
def load_library() -> ctypes.CDLL:
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
class Compiled:
    """The filter's program, the deny list's names this machine lacks, and libseccomp's version."""

    program: bytes
    skipped: tuple[str, ...]
    version: str


_lock = threading.Lock()
_compiled: Compiled | None = None
_failure: str | None = None


def compiled_filter() -> Compiled:
    """The filter, built once per process (SeccompError, remembered, when it cannot be)."""
    global _compiled, _failure
    with _lock:
        if _compiled is not None:
            return _compiled
        if _failure is not None:
            raise SeccompError(_failure)
        try:
            _compiled = _build(load_library())
        except SeccompError as error:
            _failure = str(error)
            raise
        return _compiled


def _build(lib: ctypes.CDLL) -> Compiled:
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
    return Compiled(prefix + body, tuple(skipped), described)


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

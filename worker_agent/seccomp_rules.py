"""The seccomp filter's rules (worker_agent/seccomp.py): the deny list by syscall name, its argument
conditions and the actions libseccomp applies.

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
  libseccomp's program (worker_agent/seccomp_build.py); it compares the low 32 bits, all the kernel reads;
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
"""

from __future__ import annotations

import errno
import platform
from dataclasses import dataclass

# libseccomp's action values (seccomp.h): the kernel's SECCOMP_RET_* values.
ACT_KILL_PROCESS = 0x80000000
ACT_KILL_THREAD = 0x00000000
ACT_ALLOW = 0x7FFF0000
_ACT_ERRNO = 0x00050000

# enum scmp_compare.
CMP_EQ = 4
CMP_MASKED_EQ = 7

CLONE_NEWUSER = 0x10000000
AF_ALG = 38
AF_VSOCK = 40
# personality(2) values Docker's profile allows: PER_LINUX, PER_LINUX32, UNAME26, both, and the query.
ALLOWED_PERSONALITIES = (0x0, 0x0008, 0x20000, 0x20008, 0xFFFFFFFF)

# The argument holding clone's flags: the first, except on s390 (the second).
_CLONE_FLAGS_ARG = 1 if platform.machine().startswith("s390") else 0


def action_errno(code: int) -> int:
    """SCMP_ACT_ERRNO(code): the syscall fails with `code` and does nothing."""
    return _ACT_ERRNO | (code & 0xFFFF)


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

"""Host abstract unix sockets out of a task's reach: a Landlock scope (Linux 6.12+, Landlock ABI 6).

Tasks share the host's network namespace (collectives need it), and with it the abstract unix socket
namespace: without a scope a task could connect to any daemon listening on an abstract name (D-Bus, X11,
container runtimes, another job's processes). The scope lets a task connect only to abstract sockets
made inside its own Landlock domain, that is by its own processes.

A job's workers that share a machine each get a domain of their own, yet NCCL passes CUDA memory handles
between them over abstract sockets (its cuMem IPC); so a task with a co-located peer of its job is
started without the scope (its agent says so in the task's log). MultiWorkerMirroredStrategy's usual
shape, one worker per machine holding its GPUs, keeps the scope.

The scope is set by a few lines of Python run as the task's first program (Landlock restricts the
calling process and its children only), then exec'ing the task's command.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

SYS_CREATE_RULESET, SYS_RESTRICT_SELF = 444, 446  # the same number on every architecture
LANDLOCK_CREATE_RULESET_VERSION = 1
SCOPE_ABI = 6
# Runs as the task (no_new_privs is set by bubblewrap already; set again for an unsandboxed task).
SHIM = (
    "import ctypes, os, struct, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "attr = ctypes.create_string_buffer(struct.pack('QQQ', 0, 0, 1), 24)\n"
    f"fd = libc.syscall({SYS_CREATE_RULESET}, attr, 24, 0)\n"
    "if fd < 0 or libc.prctl(38, 1, 0, 0, 0) != 0 or "
    f"libc.syscall({SYS_RESTRICT_SELF}, fd, 0) != 0:\n"
    "    sys.exit('mwms-agent: could not scope abstract unix sockets: ' + os.strerror(ctypes.get_errno()))\n"
    "os.close(fd)\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)


def unavailable() -> str:
    """Why the scope cannot be had here ("" when it can)."""
    libc = ctypes.CDLL(None, use_errno=True)
    abi = int(libc.syscall(SYS_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION))
    if abi < 0:
        return f"the kernel has no Landlock ({os.strerror(ctypes.get_errno())})"
    if abi < SCOPE_ABI:
        return f"the kernel's Landlock is ABI {abi}; scoping abstract unix sockets needs ABI {SCOPE_ABI} (Linux 6.12)"
    return ""


def shim_argv() -> list[str]:
    """The argv prefix that scopes the command after it (the agent's own interpreter, isolated mode)."""
    return [sys.executable, "-I", "-S", "-c", SHIM]


def has_co_located_peer(tf_config: str, task_index: int) -> bool:
    """Whether another worker of the job has the same host as task `task_index` (TF_CONFIG's cluster)."""
    try:
        workers = json.loads(tf_config or "{}").get("cluster", {}).get("worker", [])
        own = str(workers[task_index]).rpartition(":")[0]
    except (ValueError, AttributeError, IndexError, TypeError):
        return False
    return sum(str(endpoint).rpartition(":")[0] == own for endpoint in workers) > 1

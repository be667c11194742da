"""Whether a task may start in a warm interpreter (worker_agent/warm_pool.py), and if not, why not.

A warm interpreter imported TensorFlow before its task was known, under the pool's environment. The task
may use it only where a cold `python train.py` would have imported the same thing the same way:
- the agent's own Python running a `.py` file (not `-m`, not interpreter flags, not another program);
- no Python environment of the job's own (`--requirements`), which a cold start would put first;
- no variable read at import (TensorFlow's, XLA's, CUDA's, Python's, the dynamic loader's, OpenMP's, the
  allocator's, or mwms's own task hooks') that differs from the pool's; CUDA_VISIBLE_DEVICES is set at
  handout, before anything initialises CUDA, and TF_CONFIG is read when the program builds its strategy;
- no co-located peer of its job (a job's workers on one machine share a /dev/shm, an IPC namespace and a
  uid there, and start without the abstract-socket scope: all decided when the sandbox starts);
- no gang preflight and no shared checkpoint filesystem (another program first; a bind fixed at start);
- a memory limit above what the interpreter holds already (written into its cgroup at handout);
- and a ready interpreter for the task's set of GPUs.

Pure: the agent asks `cold_reason`, and starts cold with the reason in the task's log when it says one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mwms import task_environment

# Read when Python starts or TensorFlow is imported: a different value would change what was imported.
IMPORT_PREFIXES = ("TF_", "PYTHON", "LD_", "XLA_", "CUDA_", "OMP_", "KMP_", "MALLOC_")
# Read at start by the agent's task hooks (worker_agent/stack_handler): the fit-metrics hook's switch.
HOOK_VARIABLES = frozenset({"MWMS_AUTO_METRICS"})
# Set per task at handout and read only later (CUDA when it initialises, TensorFlow's cluster resolver).
PER_TASK_VARIABLES = frozenset({task_environment.CUDA_VISIBLE_DEVICES, task_environment.TF_CONFIG})
NO_WARM_INTERPRETER = "no warm interpreter for its GPUs is ready"
NO_POOL_FOR_GPUS = "the warm pool keeps no interpreter for its set of GPUs"
# Room above a warm interpreter's resident memory that its task's memory limit must leave: the limit is
# written into the interpreter's cgroup at handout, which the kernel refuses below what it holds.
MEMORY_MARGIN_BYTES = 64 * 1024**2


@dataclass(frozen=True)
class StartShape:
    """What of a task decides between a warm and a cold start."""

    command: Sequence[str]  # as it will run (a leading `python` resolved to the agent's interpreter)
    env: Mapping[str, str]  # the task's variables (worker_agent/task_env.py child_environment)
    own_environment: bool  # the job has its own Python environment (--requirements)
    preflight: bool
    shared_checkpoints: bool
    co_located_peer: bool
    memory_limit_bytes: int = 0  # its cgroup's limit (0: none)


def import_relevant(name: str) -> bool:
    """Whether the variable `name` can change what a Python start and `import tensorflow` do."""
    if name in PER_TASK_VARIABLES:
        return False
    return name.startswith(IMPORT_PREFIXES) or name in HOOK_VARIABLES


def changed_variables(env: Mapping[str, str], pool_env: Mapping[str, str]) -> list[str]:
    """The import-relevant variables whose value (or presence) differs between `env` and `pool_env`."""
    names = {name for name in (*env, *pool_env) if import_relevant(name)}
    return sorted(name for name in names if env.get(name) != pool_env.get(name))


def runs_python_file(command: Sequence[str], python: str) -> bool:
    """Whether `command` is the interpreter `python` running a .py file (with any arguments after it)."""
    if len(command) < 2 or os.path.realpath(command[0]) != os.path.realpath(python):
        return False
    program = command[1]
    return program.endswith(".py") and not program.startswith("-")


def cold_reason(
    shape: StartShape,
    python: str,
    pool_env: Mapping[str, str] | None,
    *,
    kept: bool,
    ready: bool,
    warm_memory_bytes: int = 0,
) -> str:
    """Why the task must start cold ("" when a warm interpreter started with `pool_env` may run it);
    `kept`: the pool keeps interpreters for the task's GPUs; `pool_env`: the variables they start with
    (None: none started yet); `ready`: one is ready now, holding `warm_memory_bytes`; `python`: the
    agent's own interpreter, the one warm interpreters run."""
    if shape.own_environment:
        return "the job has its own Python environment (--requirements)"
    if not runs_python_file(shape.command, python):
        return "the command is not `python <file>.py` run by the agent's own Python"
    if shape.preflight:
        return "the gang runs a preflight check first"
    if shape.shared_checkpoints:
        return "checkpoints live on a shared filesystem, bound into the sandbox when it starts"
    if shape.co_located_peer:
        return (
            "another worker of the job shares this machine (its /dev/shm, IPC namespace, uid and socket "
            "scope are set when the sandbox starts)"
        )
    if not kept:
        return NO_POOL_FOR_GPUS
    if pool_env is None:
        return NO_WARM_INTERPRETER
    changed = changed_variables(shape.env, pool_env)
    if changed:
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        return f"the job sets {shown}, read when TensorFlow is imported, to other values than the warm pool's"
    if not ready:
        return NO_WARM_INTERPRETER
    if 0 < shape.memory_limit_bytes < warm_memory_bytes + MEMORY_MARGIN_BYTES:
        return "its memory limit is below what a warm interpreter holds already (TensorFlow imported)"
    return ""

"""Where a task's files live and what environment and command line its child process gets."""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mwms import grpc_process, task_environment
from mwms.v1 import agent_pb2
from mwms.worker_agent.gpu_nodes import GpuNode
from mwms.worker_agent.stacks import handler_environment
from mwms.worker_agent.task_files import hand_over

# Commands starting with one of these run with the agent's own interpreter (and so its TensorFlow).
PYTHON_NAMES = ("python", "python3")


@dataclass(frozen=True)
class TaskPaths:
    """The directories and files of one task under the agent's work dir."""

    task_dir: Path
    bundle_dir: Path
    output_dir: Path
    checkpoint_dir: Path
    metrics_file: Path
    tmp_dir: Path
    stacks_dir: Path  # where the task's stack handler writes dumps on demand (worker_agent/stacks.py)
    home_dir: Path
    # The agent's own files about the task (archives it packs): never in a directory the task can write.
    scratch_dir: Path

    @classmethod
    def for_task(cls, work_dir: Path, start: agent_pb2.StartTask) -> TaskPaths:
        """jobs/<job>/attempt-<n>/task-<i>/{bundle,output,checkpoints,tmp,home,stacks,metrics.jsonl}.

        Checkpoints are the task's own (restored from the coordinator into each attempt) unless the
        coordinator names a shared checkpoint filesystem.
        """
        job_dir = work_dir / "jobs" / start.job_id
        task_dir = job_dir / f"attempt-{start.attempt}" / f"task-{start.task_index}"
        shared = Path(start.shared_checkpoint_dir) if start.shared_checkpoint_dir else None
        return cls.at(task_dir, work_dir / "scratch" / start.task_id, shared)

    @classmethod
    def at(cls, task_dir: Path, scratch_dir: Path, shared_checkpoint_dir: Path | None = None) -> TaskPaths:
        """The layout of a task dir at `task_dir` (a warm interpreter's, worker_agent/warm_pool.py, is
        not under jobs/): bundle, output, checkpoints (unless shared), tmp, stacks, home, metrics."""
        return cls(
            task_dir=task_dir,
            bundle_dir=task_dir / "bundle",
            output_dir=task_dir / "output",
            checkpoint_dir=shared_checkpoint_dir or task_dir / "checkpoints",
            metrics_file=task_dir / "metrics.jsonl",
            tmp_dir=task_dir / "tmp",
            stacks_dir=task_dir / "stacks",
            home_dir=task_dir / "home",
            scratch_dir=scratch_dir,
        )

    @property
    def writable_dirs(self) -> list[Path]:
        """The directories the task's user owns (the bundle stays the agent's: read-only to the task)."""
        dirs = [self.output_dir, self.tmp_dir, self.stacks_dir, self.home_dir]
        if self.task_dir in self.checkpoint_dir.parents:
            dirs.append(self.checkpoint_dir)
        return dirs

    def create_fresh(self) -> None:
        """Empties the task dir (a restart of the same task starts clean) and creates its directories,
        all the agent's and closed to others (0700) until `hand_over` gives them to the task's user."""
        if self.task_dir.is_symlink():
            self.task_dir.unlink()  # an earlier warm start's link to its own task dir (worker_agent/warm_pool.py)
        shutil.rmtree(self.task_dir, ignore_errors=True)
        shutil.rmtree(self.scratch_dir, ignore_errors=True)
        # jobs/, the job's and the attempt's dirs may be entered, not listed, by task users (no sandbox).
        for parent in reversed(self.task_dir.parents[:3]):
            parent.mkdir(exist_ok=True)
            parent.chmod(0o711)
        self.task_dir.mkdir()
        self.task_dir.chmod(0o700)
        self.scratch_dir.mkdir(parents=True)
        self.scratch_dir.chmod(0o700)
        self.bundle_dir.mkdir()
        self.bundle_dir.chmod(0o755)
        for directory in self.writable_dirs:
            directory.mkdir(parents=True, exist_ok=True)
            if self.task_dir in directory.parents:
                directory.chmod(0o700)

    def hand_over(self, uid: int, gid: int) -> None:
        """Gives the task dir and its writable dirs (with what was restored into them) to `uid`:`gid`."""
        os.chown(self.task_dir, uid, gid, follow_symlinks=False)
        for directory in self.writable_dirs:
            hand_over(directory, uid, gid)


def resolve_command(command: list[str], interpreter: str = sys.executable) -> list[str]:
    """The command with a leading `python`/`python3` replaced by `interpreter`: the agent's own, or that
    of the job's own environment."""
    if command and command[0] in PYTHON_NAMES:
        return [interpreter, *command[1:]]
    return list(command)


def in_environment(env: dict[str, str], prefix: Path) -> dict[str, str]:
    """The task's variables with the job's own environment (a venv at `prefix`) first on PATH, as
    activating it would: a script that runs `python` or a console script gets the job's."""
    path = env.get("PATH", os.defpath)
    return {**env, "VIRTUAL_ENV": str(prefix), "PATH": f"{prefix / 'bin'}{os.pathsep}{path}"}


# Secrets the agent (or the shell that started it) may hold; a task runs a job's code and gets none of them.
AGENT_SECRETS = frozenset({"MWMS_JOIN_TOKEN", "MWMS_TOKEN", "MWMS_ADMIN_TOKEN"})
# Besides those: every MWMS_ setting of the agent's own, and whatever is named like a secret.
SECRET_LIKE_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|_KEY$|APIKEY", re.IGNORECASE)


# The agent's own GPU settings (NVIDIA_VISIBLE_DEVICES of a container runtime, CUDA_VISIBLE_DEVICES of the
# shell that started it, ...) would contradict the GPUs a task is given: a task gets only those mwms sets.
# The driver's libraries stay reachable: they are found through ld.so's paths, not these.
AGENT_GPU_PREFIXES = ("NVIDIA_", "CUDA_")


def inherited(name: str) -> bool:
    """Whether a variable of the agent's environment is passed on to its tasks."""
    return (
        name not in AGENT_SECRETS
        and not name.startswith(("MWMS_", *AGENT_GPU_PREFIXES))
        and not SECRET_LIKE_NAME.search(name)
    )


def inherited_environment(agent_env: Mapping[str, str]) -> dict[str, str]:
    """What of the agent's environment a task (or a probe started as one) begins with: what `inherited`
    lets through, less the gRPC settings mwms gave itself (mwms/grpc_process.py): TensorFlow's gRPC would
    read them too."""
    ours = grpc_process.set_by_mwms(agent_env)
    return {name: value for name, value in agent_env.items() if inherited(name) and name not in ours}


def gpu_variables(start: agent_pb2.StartTask, gpus: Sequence[GpuNode], sandboxed: bool) -> dict[str, str]:
    """How a task is told its GPUs, in a form CUDA resolves inside its sandbox and outside it.

    By UUID (CUDA_VISIBLE_DEVICES=GPU-...; MWMS_GPU_UUIDS the same): a sandbox shows CUDA only the bound
    nodes and CUDA numbers those from 0, so a host index (GPU 1) names nothing there. Without a UUID,
    ordinals from 0 in a sandbox, host indices in PCI order (nvidia-smi's) without one. `gpus`: the
    GPUs of start.device_indices, in that order (none known: the indices alone).
    """
    if start.device_kind != agent_pb2.DEVICE_KIND_GPU:
        return {
            task_environment.CUDA_VISIBLE_DEVICES: "",
            task_environment.NUM_GPUS: "0",
            task_environment.GPU_UUIDS: "",
        }
    given = list(gpus) or [GpuNode(index, "") for index in start.device_indices]
    uuids = [gpu.uuid for gpu in given]
    variables = {task_environment.NUM_GPUS: str(len(given)), task_environment.GPU_UUIDS: ",".join(uuids)}
    if all(uuids):
        visible = ",".join(uuids)
    elif sandboxed:
        visible = ",".join(str(ordinal) for ordinal in range(len(given)))
    else:
        visible = ",".join(str(gpu.index) for gpu in given)
        variables["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's own order is fastest first
    variables[task_environment.CUDA_VISIBLE_DEVICES] = visible
    return variables


def child_environment(
    start: agent_pb2.StartTask,
    paths: TaskPaths,
    agent_env: Mapping[str, str],
    user: tuple[str, bool] = ("", True),
    *,
    gpus: Sequence[GpuNode] = (),
    sandboxed: bool = False,
) -> dict[str, str]:
    """The agent's environment less its secrets, settings and GPU variables, then StartTask.env, then the
    variables the agent owns (mwms/task_environment.py names them). `user` is (name, shared with the
    agent): a task of its own user gets its own HOME. `gpus`, `sandboxed`: see `gpu_variables`."""
    env = inherited_environment(agent_env)
    # The gang's TF_CONFIG comes from the coordinator alone; one from the agent's shell would mislead TensorFlow.
    env.pop(task_environment.TF_CONFIG, None)
    env.update(start.env)
    for variable, default in task_environment.DEFAULTED_ENV.items():
        if variable not in start.env:
            env[variable] = default
    # Every task gets one, a single worker's included; only a coordinator older than that sends none.
    if start.tf_config:
        env[task_environment.TF_CONFIG] = start.tf_config
    else:
        env.pop(task_environment.TF_CONFIG, None)
    is_gpu = start.device_kind == agent_pb2.DEVICE_KIND_GPU
    env.update(gpu_variables(start, gpus, sandboxed))
    env.update(
        {
            task_environment.JOB_ID: start.job_id,
            task_environment.TASK_ID: start.task_id,
            task_environment.ATTEMPT: str(start.attempt),
            task_environment.TASK_INDEX: str(start.task_index),
            task_environment.NUM_WORKERS: str(start.num_workers),
            task_environment.OUTPUT_DIR: str(paths.output_dir),
            task_environment.CHECKPOINT_DIR: str(paths.checkpoint_dir),
            task_environment.METRICS_FILE: str(paths.metrics_file),
            task_environment.DEVICE_KIND: task_environment.DEVICE_KIND_GPU
            if is_gpu
            else task_environment.DEVICE_KIND_CPU,
            task_environment.PYTHONUNBUFFERED: "1",
            # Temporary files (e.g. non-chief save paths) stay inside the task dir, removed with the task.
            task_environment.TMPDIR: str(paths.tmp_dir),
            task_environment.PWD: str(paths.bundle_dir),  # its working directory, not the agent's
        }
    )
    name, shared = user
    if not shared:
        env.update(
            {
                task_environment.HOME: str(paths.home_dir),
                task_environment.USER: name,
                task_environment.LOGNAME: name,
            }
        )
    env.update(handler_environment(env, paths.stacks_dir))  # stacks on demand, without changing the program
    return env

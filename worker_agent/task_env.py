"""Where a task's files live and what environment and command line its child process gets."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mwms.v1 import agent_pb2
from worker_agent.stacks import handler_environment

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

    @classmethod
    def for_task(cls, work_dir: Path, start: agent_pb2.StartTask) -> TaskPaths:
        """jobs/<job>/attempt-<n>/task-<i>/{bundle,output,metrics.jsonl}; checkpoints per job (or shared)."""
        job_dir = work_dir / "jobs" / start.job_id
        task_dir = job_dir / f"attempt-{start.attempt}" / f"task-{start.task_index}"
        checkpoint_dir = (
            Path(start.shared_checkpoint_dir) if start.shared_checkpoint_dir else job_dir / "checkpoints"
        )
        return cls(
            task_dir=task_dir,
            bundle_dir=task_dir / "bundle",
            output_dir=task_dir / "output",
            checkpoint_dir=checkpoint_dir,
            metrics_file=task_dir / "metrics.jsonl",
            tmp_dir=task_dir / "tmp",
            stacks_dir=task_dir / "stacks",
        )

    def create_fresh(self) -> None:
        """Empties the task dir (a restart of the same task starts clean) and creates the directories."""
        shutil.rmtree(self.task_dir, ignore_errors=True)
        self.bundle_dir.mkdir(parents=True)
        self.output_dir.mkdir(parents=True)
        self.tmp_dir.mkdir(parents=True)
        self.stacks_dir.mkdir(parents=True)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)


def resolve_command(command: list[str]) -> list[str]:
    """The command with a leading `python`/`python3` replaced by the agent's interpreter."""
    if command and command[0] in PYTHON_NAMES:
        return [sys.executable, *command[1:]]
    return list(command)


# Secrets the agent (or the shell that started it) may hold; a task runs a job's code and gets none of them.
AGENT_SECRETS = frozenset({"MWMS_JOIN_TOKEN", "MWMS_TOKEN", "MWMS_ADMIN_TOKEN"})


def child_environment(
    start: agent_pb2.StartTask, paths: TaskPaths, agent_env: Mapping[str, str]
) -> dict[str, str]:
    """The agent's environment less its secrets, then StartTask.env, then the variables the agent owns."""
    env = {name: value for name, value in agent_env.items() if name not in AGENT_SECRETS}
    # A single-worker job has no TF_CONFIG; one inherited from the agent's shell would mislead TensorFlow.
    env.pop("TF_CONFIG", None)
    env.update(start.env)
    is_gpu = start.device_kind == agent_pb2.DEVICE_KIND_GPU
    if "TF_USE_LEGACY_KERAS" not in start.env:
        env["TF_USE_LEGACY_KERAS"] = "1"
    if start.tf_config:
        env["TF_CONFIG"] = start.tf_config
    else:
        env.pop("TF_CONFIG", None)
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in start.device_indices) if is_gpu else "",
            "MWMS_JOB_ID": start.job_id,
            "MWMS_TASK_ID": start.task_id,
            "MWMS_ATTEMPT": str(start.attempt),
            "MWMS_TASK_INDEX": str(start.task_index),
            "MWMS_NUM_WORKERS": str(start.num_workers),
            "MWMS_OUTPUT_DIR": str(paths.output_dir),
            "MWMS_CHECKPOINT_DIR": str(paths.checkpoint_dir),
            "MWMS_METRICS_FILE": str(paths.metrics_file),
            "MWMS_DEVICE_KIND": "gpu" if is_gpu else "cpu",
            "MWMS_NUM_GPUS": str(len(start.device_indices)) if is_gpu else "0",
            "PYTHONUNBUFFERED": "1",
            # Temporary files (e.g. non-chief save paths) stay inside the task dir, removed with the task.
            "TMPDIR": str(paths.tmp_dir),
        }
    )
    env.update(handler_environment(env, paths.stacks_dir))  # stacks on demand, without changing the program
    return env

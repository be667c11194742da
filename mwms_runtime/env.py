"""The task's view of its job: identity, cluster shape and directories, read from MWMS_* and TF_CONFIG.

Works outside a job too: a program started by hand is a single worker, the chief, and writes under
``./mwms-output``. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from mwms import task_environment

DEFAULT_OUTPUT_DIR = "mwms-output"


@dataclass(frozen=True)
class TaskContext:
    """Who this process is within its job and where it writes."""

    job_id: str
    attempt: int
    task_index: int
    num_workers: int
    is_chief: bool
    output_dir: str
    checkpoint_dir: str
    metrics_file: str | None
    num_gpus: int | None
    in_job: bool


def _tf_config() -> dict:
    raw = os.environ.get(task_environment.TF_CONFIG, "").strip()
    if not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"TF_CONFIG is not valid JSON: {exc}") from exc
    return parsed if isinstance(parsed, dict) else {}


def _int_env(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError as exc:
        raise RuntimeError(f"{name}={raw!r} is not an integer") from exc


def float_env(name: str) -> float | None:
    """Return the float value of environment variable ``name``, or None when unset or empty."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError as exc:
        raise RuntimeError(f"{name}={raw!r} is not a number") from exc


def _cluster_shape(tf_config: dict) -> tuple[int, int, bool]:
    """Return (task_index, num_workers, is_chief) as TF_CONFIG describes them."""
    cluster = tf_config.get("cluster") or {}
    task = tf_config.get("task") or {}
    task_type = task.get("type", "worker")
    index = int(task.get("index", 0))
    chiefs = len(cluster.get("chief", []))
    workers = len(cluster.get("worker", []))
    if not cluster:
        return 0, 1, True
    if task_type == "chief":
        return 0, chiefs + workers, True
    # With a separate "chief" task, workers are numbered after it.
    return index + chiefs, chiefs + workers, chiefs == 0 and index == 0


def context() -> TaskContext:
    """Return this task's context; a program outside a job is a single chief writing to ./mwms-output."""
    tf_config = _tf_config()
    tf_index, tf_workers, tf_chief = _cluster_shape(tf_config)
    env_index = _int_env(task_environment.TASK_INDEX)
    task_index = env_index if env_index is not None else tf_index
    num_workers = _int_env(task_environment.NUM_WORKERS) or tf_workers
    is_chief = task_index == 0 if env_index is not None else tf_chief
    output_dir = os.environ.get(task_environment.OUTPUT_DIR) or os.path.abspath(DEFAULT_OUTPUT_DIR)
    checkpoint_dir = os.environ.get(task_environment.CHECKPOINT_DIR) or os.path.join(
        output_dir, "checkpoints"
    )
    return TaskContext(
        job_id=os.environ.get(task_environment.JOB_ID, "local"),
        attempt=_int_env(task_environment.ATTEMPT) or 0,
        task_index=task_index,
        num_workers=num_workers,
        is_chief=is_chief,
        output_dir=output_dir,
        checkpoint_dir=checkpoint_dir,
        metrics_file=os.environ.get(task_environment.METRICS_FILE) or None,
        num_gpus=_int_env(task_environment.NUM_GPUS),
        in_job=task_environment.JOB_ID in os.environ,
    )


def output_dir() -> str:
    """Return (and create) the directory where this task writes its outputs."""
    path = context().output_dir
    os.makedirs(path, exist_ok=True)
    return path


def checkpoint_dir() -> str:
    """Return (and create) the job-level checkpoint directory that outlives attempts."""
    path = context().checkpoint_dir
    os.makedirs(path, exist_ok=True)
    return path

"""Build the job's MultiWorkerMirroredStrategy from TF_CONFIG and the MWMS_* settings, once per process.

Works around the two known issues on TensorFlow's MWMS page: the cluster resolver reports the GPUs the
agent gave this task (not every GPU on the machine), and creating the strategy after TensorFlow's eager
context has started fails with a message that says what to do instead of an obscure one.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from mwms_runtime.env import context, float_env

_lock = threading.Lock()
_strategy: Any = None
_VALID_COMMUNICATION = ("AUTO", "RING", "NCCL")


def _num_gpus_given() -> int | None:
    """GPUs the agent gave this task, or None outside a job (TensorFlow then counts them itself)."""
    ctx = context()
    if os.environ.get("MWMS_DEVICE_KIND", "").lower() == "cpu":
        return 0
    return ctx.num_gpus


def _make_resolver(num_gpus: int | None) -> Any:
    import tensorflow as tf

    base: Any = tf.distribute.cluster_resolver.TFConfigClusterResolver

    class TaskGpuClusterResolver(base):
        """TFConfigClusterResolver that reports the GPUs this task was given."""

        def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
            """Return {"GPU": n} for the n GPUs given to this task, {} on CPU."""
            if num_gpus is None:
                return super().num_accelerators(task_type, task_id, config_proto)
            return {"GPU": num_gpus} if num_gpus > 0 else {}

    return TaskGpuClusterResolver()


def _eager_context_started() -> bool:
    from tensorflow.python.eager import context as eager_context

    ctx = eager_context.context()
    return bool(getattr(ctx, "_initialized", False) or getattr(ctx, "_context_handle", None) is not None)


def _communication_name(communication: Any, num_gpus: int | None) -> str:
    if communication is None:
        communication = os.environ.get("MWMS_COMMUNICATION") or None
    if communication is None:
        return "NCCL" if num_gpus else "AUTO"
    name = getattr(communication, "name", str(communication)).upper()
    if name not in _VALID_COMMUNICATION:
        raise ValueError(
            f"communication must be one of {', '.join(_VALID_COMMUNICATION)}, got {communication!r}"
        )
    if name == "NCCL" and num_gpus == 0:
        # A job spec asking for NCCL can still be placed on CPU tasks; NCCL cannot run there.
        print("mwms_runtime: NCCL needs GPUs and this task has none; using RING", file=sys.stderr)
        return "RING"
    return name


def communication_options(
    communication: Any = None, timeout_seconds: float | None = None, bytes_per_pack: int | None = None
) -> Any:
    """Return the CommunicationOptions from the arguments, else the MWMS_* environment, else defaults."""
    import tensorflow as tf

    name = _communication_name(communication, _num_gpus_given())
    if timeout_seconds is None:
        timeout_seconds = float_env("MWMS_COLLECTIVE_TIMEOUT_S")
    if bytes_per_pack is None:
        raw = os.environ.get("MWMS_BYTES_PER_PACK", "").strip()
        bytes_per_pack = int(raw) if raw else 0
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=bytes_per_pack,
        timeout_seconds=timeout_seconds,
        implementation=getattr(tf.distribute.experimental.CommunicationImplementation, name),
    )


def strategy(
    communication: Any = None, timeout_seconds: float | None = None, bytes_per_pack: int | None = None
) -> Any:
    """Return this process's MultiWorkerMirroredStrategy, creating it on the first call."""
    global _strategy
    with _lock:
        if _strategy is not None:
            return _strategy
        import tensorflow as tf

        # Raised even without TF_CONFIG (where TF would cope) so a program tried alone fails the same way
        # it would under a multi-worker job.
        if _eager_context_started():
            raise RuntimeError(
                "call mwms_runtime.strategy() before any other TensorFlow API that runs an op or creates "
                "a tensor, dataset or model: MultiWorkerMirroredStrategy must configure TensorFlow's "
                "collective ops when its eager context starts, and it has already started in this process."
            )
        options = communication_options(communication, timeout_seconds, bytes_per_pack)
        _strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=_make_resolver(_num_gpus_given()), communication_options=options
        )
        return _strategy


def current_strategy() -> Any:
    """Return the strategy built by strategy(), or None when it has not been built yet."""
    return _strategy

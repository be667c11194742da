"""Build the job's MultiWorkerMirroredStrategy from TF_CONFIG and the MWMS_* settings, once per process.

Works around the two known issues on TensorFlow's MWMS page: the strategy uses the GPUs the agent gave
this task (not every GPU TensorFlow can see), and creating the strategy after TensorFlow's eager context
has started fails with a message that says what to do instead of an obscure one.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from mwms import task_environment
from mwms_runtime.env import context, float_env

_lock = threading.Lock()
_strategy: Any = None
_strategy_options: tuple[str, float | None, int] | None = None
_VALID_COMMUNICATION = ("AUTO", "RING", "NCCL")


def _num_gpus_given() -> int | None:
    """GPUs the agent gave this task, or None outside a job (TensorFlow then counts them itself)."""
    ctx = context()
    if os.environ.get(task_environment.DEVICE_KIND, "").lower() == task_environment.DEVICE_KIND_CPU:
        return 0
    return ctx.num_gpus


def _make_resolver(num_gpus: int | None) -> Any:
    """Return the cluster resolver for this task: TF_CONFIG's cluster with ``num_gpus`` GPUs per worker.

    MWMS ignores ``num_accelerators()`` of a TFConfigClusterResolver (or subclass) and counts every GPU
    TensorFlow sees, so the given count is handed over in a SimpleClusterResolver, which it does ask.
    A task always has a TF_CONFIG, a gang of one included (one worker: MWMS runs its collectives among
    that worker's own devices, with the port the agent gave it). Without one (a program run by hand) the
    cluster spec is empty and MWMS runs as a single local worker.
    """
    import tensorflow as tf

    from_tf_config = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if num_gpus is None:
        return from_tf_config
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster_spec=from_tf_config.cluster_spec(),
        task_type=from_tf_config.task_type,
        task_id=from_tf_config.task_id,
        environment=from_tf_config.environment,
        num_accelerators={"GPU": num_gpus} if num_gpus > 0 else {},
        rpc_layer=from_tf_config.rpc_layer or "grpc",
    )


def _eager_context_started() -> bool:
    from tensorflow.python.eager import context as eager_context

    ctx = eager_context.context()
    return bool(getattr(ctx, "_initialized", False) or getattr(ctx, "_context_handle", None) is not None)


def _communication_name(communication: Any, num_gpus: int | None) -> str:
    if communication is None:
        communication = os.environ.get(task_environment.COMMUNICATION) or None
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
        timeout_seconds = float_env(task_environment.COLLECTIVE_TIMEOUT_S)
    if bytes_per_pack is None:
        raw = os.environ.get(task_environment.BYTES_PER_PACK, "").strip()
        bytes_per_pack = int(raw) if raw else 0
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=bytes_per_pack,
        timeout_seconds=timeout_seconds,
        implementation=getattr(tf.distribute.experimental.CommunicationImplementation, name),
    )


def _options_key(options: Any) -> tuple[str, float | None, int]:
    return (options.implementation.name, options.timeout_seconds, int(options.bytes_per_pack))


def _check_same_arguments(
    communication: Any, timeout_seconds: float | None, bytes_per_pack: int | None
) -> None:
    """Raise if an argument given now differs from what the existing strategy was built with."""
    built = _strategy_options
    assert built is not None
    asked: dict[str, tuple[Any, Any]] = {}
    if communication is not None:
        asked["communication"] = (_communication_name(communication, _num_gpus_given()), built[0])
    if timeout_seconds is not None:
        asked["timeout_seconds"] = (float(timeout_seconds), built[1])
    if bytes_per_pack is not None:
        asked["bytes_per_pack"] = (int(bytes_per_pack), built[2])
    differing = [
        f"{name}={now!r} (built with {then!r})" for name, (now, then) in asked.items() if now != then
    ]
    if differing:
        raise ValueError(
            "mwms_runtime.strategy() was already called and a process has one strategy, but this call "
            f"asks for {', '.join(differing)}: pass the same arguments, or none to get the existing one"
        )


def strategy(
    communication: Any = None, timeout_seconds: float | None = None, bytes_per_pack: int | None = None
) -> Any:
    """Return this process's MultiWorkerMirroredStrategy, creating it on the first call.

    Later calls return the same strategy; an argument they give (not None) must match the one it was
    built with, else ValueError.
    """
    global _strategy, _strategy_options
    with _lock:
        if _strategy is not None:
            _check_same_arguments(communication, timeout_seconds, bytes_per_pack)
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
        _strategy_options = _options_key(options)
        return _strategy


def current_strategy() -> Any:
    """Return the strategy built by strategy(), or None when it has not been built yet."""
    return _strategy

"""report(): reduce metrics across every replica of every worker in one collective, then hand them to the writer.

Each value is turned into a per-replica (sum, count) pair, so one SUM all-reduce of a packed vector serves
every metric of a call: SUM is the total of the sums, MEAN is total sum / total count.

- python numbers, numpy values, plain tensors and Mirrored values are this worker's value (count 1 per
  element, on the worker's first replica): MEAN averages workers, SUM adds them.
- PerReplica values (from ``strategy.run``) contribute each local replica's component.
- A non-scalar value is treated as per-example values: every element counts, like
  ``strategy.reduce(op, value, axis=0)`` (MEAN divides by the total number of elements, so a short last
  batch gets the right denominator).

report() is a collective: every worker must call it at the same steps with the same metric names. A call
that waits longer than the report timeout for the other workers ends the process with exit code 70 and a
message saying so, instead of hanging.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from mwms_runtime import writer
from mwms_runtime.env import context, float_env
from mwms_runtime.strategy_factory import current_strategy

DEFAULT_REPORT_TIMEOUT_S = 120.0
EXIT_REPORT_MISMATCH = 70
_WATCHDOG_GRACE_S = 5.0
_OPS = ("MEAN", "SUM")


def report_timeout_seconds() -> float:
    """Seconds one report() waits for the other workers: MWMS_REPORT_TIMEOUT_S, MWMS_COLLECTIVE_TIMEOUT_S or 120."""
    for name in ("MWMS_REPORT_TIMEOUT_S", "MWMS_COLLECTIVE_TIMEOUT_S"):
        value = float_env(name)
        if value is not None and value > 0:
            return value
    return DEFAULT_REPORT_TIMEOUT_S


def _op_name(op: Any) -> str:
    name = getattr(op, "name", op)
    name = str(name).upper()
    if name not in _OPS:
        raise ValueError(f"reduce op must be 'MEAN' or 'SUM', got {op!r}")
    return name


def _ops_for(names: list[str], reduce: Any) -> dict[str, str]:
    if isinstance(reduce, Mapping):
        unknown = set(reduce) - set(names)
        if unknown:
            raise ValueError(f"reduce names metrics that were not reported: {sorted(unknown)}")
        return {n: _op_name(reduce.get(n, "MEAN")) for n in names}
    op = _op_name(reduce)
    return {n: op for n in names}


def _is_plain(value: Any) -> bool:
    return isinstance(value, (int, float, np.number, np.ndarray)) and not isinstance(value, bool)


def _sum_count(value: Any) -> tuple[float, float]:
    array = np.asarray(value.numpy() if hasattr(value, "numpy") else value, dtype=np.float64)
    return float(array.sum()), float(array.size)


def _local_components(value: Any, strategy: Any, num_local: int) -> list[tuple[float, float]]:
    """Return one (sum, count) per local replica for one metric value."""
    if strategy is not None and not _is_plain(value):
        import tensorflow as tf
        from tensorflow.python.distribute import values as distribute_values

        if isinstance(value, tf.distribute.DistributedValues) and not isinstance(
            value, distribute_values.Mirrored
        ):
            parts = [_sum_count(v) for v in strategy.experimental_local_results(value)]
            if len(parts) != num_local:
                raise ValueError(f"expected {num_local} local replica values, got {len(parts)}")
            return parts
        if isinstance(value, distribute_values.Mirrored):
            value = strategy.experimental_local_results(value)[0]
    return [_sum_count(value)] + [(0.0, 0.0)] * (num_local - 1)


def _abort(step: int, detail: str) -> None:
    seconds = report_timeout_seconds()
    print(
        f"mwms_runtime.report() at step {step} waited {seconds:g} s for the other workers: every worker "
        f"must call report() at the same steps (with the same metric names). {detail}".rstrip(),
        file=sys.stderr,
        flush=True,
    )
    writer.flush(timeout=5.0)
    os._exit(EXIT_REPORT_MISMATCH)


def _all_reduce_sum(strategy: Any, packed: list[np.ndarray], step: int) -> np.ndarray:
    """SUM the per-local-replica vectors across every replica of every worker, with a timeout."""
    import tensorflow as tf

    if not tf.executing_eagerly():
        raise RuntimeError("mwms_runtime.report() must be called from Python, not inside a tf.function")
    devices = strategy.extended.worker_devices

    def value_fn(value_context):
        local = value_context.replica_id_in_sync_group % len(devices)
        with tf.device(devices[local]):
            return tf.constant(packed[local])

    per_replica = strategy.experimental_distribute_values_from_function(value_fn)
    timeout = report_timeout_seconds()
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)
    watchdog = threading.Timer(timeout + _WATCHDOG_GRACE_S, _abort, args=(step, "(watchdog)"))
    watchdog.daemon = True
    watchdog.start()
    try:
        reduced = strategy.extended.reduce_to(
            tf.distribute.ReduceOp.SUM, per_replica, destinations="/device:CPU:0", options=options
        )
        return strategy.experimental_local_results(reduced)[0].numpy()
    except tf.errors.OpError as exc:
        # Drop TF's "{{function_node ...}}" prefix: the rest says what happened.
        text = re.sub(r"\{\{.*?\}\}", "", str(exc)).strip()
        first_line = text.splitlines()[0] if text else type(exc).__name__
        _abort(step, f"The collective failed with {type(exc).__name__}: {first_line}")
        raise  # unreachable: _abort exits
    finally:
        watchdog.cancel()


def _reduce(metrics: Mapping[str, Any], ops: dict[str, str], step: int) -> dict[str, float]:
    strategy = current_strategy()
    if strategy is None and "tensorflow" in sys.modules:
        import tensorflow as tf

        if tf.distribute.has_strategy():
            strategy = tf.distribute.get_strategy()
    ctx = context()
    if strategy is None and ctx.num_workers > 1:
        raise RuntimeError("call mwms_runtime.strategy() before mwms_runtime.report() in a multi-worker job")
    # Sorted so workers that built the dict in a different order still pack the same vector.
    names = sorted(metrics)
    num_local = len(strategy.extended.worker_devices) if strategy is not None else 1
    per_metric = [_local_components(metrics[n], strategy, num_local) for n in names]
    packed = [
        np.array([pm[r][0] for pm in per_metric] + [pm[r][1] for pm in per_metric], dtype=np.float64)
        for r in range(num_local)
    ]
    if strategy is not None and strategy.num_replicas_in_sync > 1:
        total = _all_reduce_sum(strategy, packed, step)
    else:
        total = np.sum(packed, axis=0)
    sums, counts = total[: len(names)], total[len(names) :]
    result = {}
    for i, name in enumerate(names):
        if ops[name] == "SUM":
            result[name] = float(sums[i])
        else:
            result[name] = float(sums[i] / counts[i]) if counts[i] else float("nan")
    return result


def report(step: int, metrics: Mapping[str, Any], reduce: Any = "MEAN") -> dict[str, float]:
    """Reduce ``metrics`` across all workers (a collective) and, on the chief, queue them for writing."""
    if not metrics:
        return {}
    step = int(step)
    ops = _ops_for(list(metrics), reduce)
    values = _reduce(metrics, ops, step)
    if context().is_chief:
        writer.get_writer().put(writer.MetricsRecord(step=step, values=values, time=time.time()))
    return values

"""report(): reduce metrics across every replica of every worker in one collective, then hand them to the writer.

Each value is turned into a per-replica (sum, count) pair, so one SUM all-reduce of a packed vector serves
every metric of a call: SUM is the total of the sums, MEAN is total sum / total count.

- python numbers, numpy values, plain tensors and Mirrored values are this worker's value (count 1 per
  element, on the worker's first replica): MEAN averages workers, SUM adds them.
- PerReplica values (from ``strategy.run``) contribute each local replica's component.
- A non-scalar value is treated as per-example values: every element counts, like
  ``strategy.reduce(op, value, axis=0)`` (MEAN divides by the total number of elements, so a short last
  batch gets the right denominator).

Values already identical on every worker skip all of this: a ``ReducedMetrics`` (from ``reduce_metrics``
inside the training step, which reduces every metric in one in-graph collective) or a dict passed with
``reduced=True`` (results of ``strategy.reduce``, fit's logs) is converted and written by the chief, with
no collective, so workers that differ in whether they call it cannot hang each other.

Otherwise report() is a collective: every worker must call it at the same steps with the same metric names and
ops. The packed vector carries this worker's step and a fingerprint of (step, names, ops) on its first
replica; a sum that is not num_workers times this worker's own ends the process with exit code 70 and a
message naming the step and names. So does a call that waits longer than the report timeout for the
other workers, instead of hanging. Any other collective failure (a peer crashed) is re-raised.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from mwms import task_environment
from mwms_runtime import save_paths, writer
from mwms_runtime.env import context, float_env
from mwms_runtime.reduced import ReducedMetrics
from mwms_runtime.strategy_factory import current_strategy

DEFAULT_REPORT_TIMEOUT_S = 120.0
EXIT_REPORT_MISMATCH = 70
_WATCHDOG_GRACE_S = 5.0
_OPS = ("MEAN", "SUM")


def report_timeout_seconds() -> float:
    """Seconds one report() waits for the other workers: MWMS_REPORT_TIMEOUT_S, MWMS_COLLECTIVE_TIMEOUT_S or 120."""
    for name in (task_environment.REPORT_TIMEOUT_S, task_environment.COLLECTIVE_TIMEOUT_S):
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


def ops_for(names: list[str], reduce: Any) -> dict[str, str]:
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


def _abort(message: str) -> None:
    """Print ``message``, write what was reported so far and end the process with exit code 70."""
    print(message, file=sys.stderr, flush=True)
    writer.flush(timeout=5.0)
    save_paths.cleanup_all()  # os._exit skips atexit
    os._exit(EXIT_REPORT_MISMATCH)


def _abort_timeout(step: int, detail: str) -> None:
    seconds = report_timeout_seconds()
    _abort(
        f"mwms_runtime.report() at step {step} waited {seconds:g} s for the other workers: every worker "
        f"must call report() at the same steps (with the same metric names). {detail}".rstrip()
    )


def _first_line(exc: Exception) -> str:
    # Drop TF's "{{function_node ...}}" prefix: the rest says what happened.
    text = re.sub(r"\{\{.*?\}\}", "", str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _mismatch_message(step: int, ops: dict[str, str], num_workers: int) -> str:
    names = ", ".join(f"{name} ({ops[name]})" for name in sorted(ops))
    return (
        f"mwms_runtime.report() at step {step}: the {num_workers} workers did not all report this step "
        f"with the same metric names and ops (this worker reported {names}). Every worker must call "
        "report() at the same steps with the same metric names and reduce ops."
    )


def _all_reduce_sum(
    strategy: Any, packed: list[np.ndarray], step: int, ops: dict[str, str], num_workers: int
) -> np.ndarray:
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
    watchdog = threading.Timer(timeout + _WATCHDOG_GRACE_S, _abort_timeout, args=(step, "(watchdog)"))
    watchdog.daemon = True
    started = time.monotonic()
    watchdog.start()
    try:
        reduced = strategy.extended.reduce_to(
            tf.distribute.ReduceOp.SUM, per_replica, destinations="/device:CPU:0", options=options
        )
        return strategy.experimental_local_results(reduced)[0].numpy()
    except tf.errors.DeadlineExceededError as exc:
        _abort_timeout(step, f"The collective failed with {type(exc).__name__}: {_first_line(exc)}")
        raise  # unreachable: _abort exits
    except tf.errors.InvalidArgumentError as exc:
        if "Shape mismatch" in str(exc):  # the workers packed different numbers of metrics
            _abort(_mismatch_message(step, ops, num_workers))
        _note_failure(step, started, exc)
        raise
    except tf.errors.OpError as exc:
        # Not a timeout: most often a peer ended. Say where it happened and let the real error surface.
        _note_failure(step, started, exc)
        raise
    finally:
        watchdog.cancel()


def _note_failure(step: int, started: float, exc: Exception) -> None:
    print(
        f"mwms_runtime.report() at step {step} failed after {time.monotonic() - started:.1f} s: "
        f"{type(exc).__name__}: {_first_line(exc)}",
        file=sys.stderr,
        flush=True,
    )


def _fingerprint(step: int, ops: dict[str, str]) -> float:
    """24-bit CRC of the step, names and ops: exact in float64 even when summed over many workers."""
    text = f"{step}|" + ",".join(f"{name}:{ops[name]}" for name in sorted(ops))
    return float(zlib.crc32(text.encode("utf-8")) & 0xFFFFFF)


def names_fingerprint(ops: dict[str, str]) -> float:
    """24-bit CRC of the names and ops alone (reduce_metrics does not know the step when it is traced)."""
    text = "reduced|" + ",".join(f"{name}:{ops[name]}" for name in sorted(ops))
    return float(zlib.crc32(text.encode("utf-8")) & 0xFFFFFF)


def _check_agreement(header: np.ndarray, step: int, ops: dict[str, str], num_workers: int) -> None:
    """Abort unless every worker packed the same step and fingerprint (the sums are num_workers x own)."""
    expected = np.array([step, _fingerprint(step, ops)], dtype=np.float64) * num_workers
    if not np.array_equal(header, expected):
        _abort(_mismatch_message(step, ops, num_workers))


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
    # The first replica also carries (step, fingerprint) so the workers can check they agree.
    header = [[float(step), _fingerprint(step, ops)]] + [[0.0, 0.0]] * (num_local - 1)
    packed = [
        np.array(
            [pm[r][0] for pm in per_metric] + [pm[r][1] for pm in per_metric] + header[r], dtype=np.float64
        )
        for r in range(num_local)
    ]
    if strategy is not None and strategy.num_replicas_in_sync > 1:
        num_workers = strategy.num_replicas_in_sync // num_local
        total = _all_reduce_sum(strategy, packed, step, ops, num_workers)
        _check_agreement(total[-2:], step, ops, num_workers)
    else:
        total = np.sum(packed, axis=0)
    sums, counts = total[: len(names)], total[len(names) : 2 * len(names)]
    result = {}
    for i, name in enumerate(names):
        if ops[name] == "SUM":
            result[name] = float(sums[i])
        else:
            result[name] = float(sums[i] / counts[i]) if counts[i] else float("nan")
    return result


_chief_by_env: dict[tuple[str | None, str | None], bool] = {}


def _is_chief() -> bool:
    """context().is_chief, remembered per (MWMS_TASK_INDEX, TF_CONFIG): report() may run every step."""
    key = (os.environ.get(task_environment.TASK_INDEX), os.environ.get(task_environment.TF_CONFIG))
    chief = _chief_by_env.get(key)
    if chief is None:
        chief = _chief_by_env[key] = context().is_chief
    return chief


def _identical_scalar(name: str, value: Any) -> float:
    """A value the caller says is already the same on every worker, as a float (no collective)."""
    if not _is_plain(value) and "tensorflow" in sys.modules:
        import tensorflow as tf
        from tensorflow.python.distribute import values as distribute_values

        if isinstance(value, distribute_values.Mirrored):
            value = value._values[0]
        elif isinstance(value, tf.distribute.DistributedValues):
            raise ValueError(
                f"report(..., reduced=True) got a per-replica value for {name!r}: it differs between "
                "replicas, so report it without reduced=True (report() then reduces it), or reduce it "
                "first (strategy.reduce, mwms_runtime.reduce_metrics)"
            )
    array = np.asarray(value.numpy() if hasattr(value, "numpy") else value, dtype=np.float64)
    if array.size != 1:
        raise ValueError(
            f"report(..., reduced=True) got {array.size} values for {name!r}: a reduced metric is one number"
        )
    return float(array.reshape(()))


def _report_reduced(step: int, metrics: Mapping[str, Any], agreed: Any = True) -> dict[str, float]:
    """Write values that are already identical on every worker: the chief queues them, nobody reduces."""
    if not bool(np.asarray(agreed.numpy() if hasattr(agreed, "numpy") else agreed)):
        names = ", ".join(sorted(metrics))
        _abort(
            f"mwms_runtime.report() at step {step}: the workers did not all reduce the same metric names "
            f"and ops in reduce_metrics() (this worker reduced {names}). Every worker must call "
            "reduce_metrics() in the same steps with the same metric names and reduce ops."
        )
    values = {name: _identical_scalar(name, metrics[name]) for name in sorted(metrics)}
    if _is_chief():
        writer.get_writer().put(writer.MetricsRecord(step=step, values=values, time=time.time()))
    return values


def report(
    step: int, metrics: Mapping[str, Any] | ReducedMetrics, reduce: Any = "MEAN", reduced: bool = False
) -> dict[str, float]:
    """Reduce ``metrics`` across all workers (a collective) and, on the chief, queue them for writing.

    Values that are already identical on every worker need no collective: a ``ReducedMetrics`` from
    ``reduce_metrics()``, or a dict passed with ``reduced=True`` (results of ``strategy.reduce``, fit's
    logs). Then only the chief writes them and ``reduce`` is not used; no worker waits for another.
    """
    if isinstance(metrics, ReducedMetrics):
        return _report_reduced(int(step), metrics.values, metrics.agreed) if metrics.values else {}
    if not metrics:
        return {}
    step = int(step)
    if reduced:
        return _report_reduced(step, metrics)
    ops = ops_for(list(metrics), reduce)
    values = _reduce(metrics, ops, step)
    if _is_chief():
        writer.get_writer().put(writer.MetricsRecord(step=step, values=values, time=time.time()))
    return values

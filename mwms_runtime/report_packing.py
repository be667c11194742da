"""How one report() call becomes numbers to all-reduce, and its reduced values again.

Each metric value turns into one (sum, count) pair per local replica; a call packs them, with its step and a
fingerprint of (step, names, ops), into one float64 vector per local replica (``Entry``). Also here: the
reduce ops a call asks for, the (strategy, local replicas, workers) shape of this process, and the float of a
value the caller says is already identical on every worker.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mwms_runtime.env import context
from mwms_runtime.strategy_factory import current_strategy

OPS = ("MEAN", "SUM")


def op_name(op: Any) -> str:
    name = getattr(op, "name", op)
    name = str(name).upper()
    if name not in OPS:
        raise ValueError(f"reduce op must be 'MEAN' or 'SUM', got {op!r}")
    return name


def ops_for(names: list[str], reduce: Any) -> dict[str, str]:
    if isinstance(reduce, Mapping):
        unknown = set(reduce) - set(names)
        if unknown:
            raise ValueError(f"reduce names metrics that were not reported: {sorted(unknown)}")
        return {n: op_name(reduce.get(n, "MEAN")) for n in names}
    op = op_name(reduce)
    return {n: op for n in names}


def is_plain(value: Any) -> bool:
    return isinstance(value, (int, float, np.number, np.ndarray)) and not isinstance(value, bool)


def sum_count(value: Any) -> tuple[float, float]:
    array = np.asarray(value.numpy() if hasattr(value, "numpy") else value, dtype=np.float64)
    return float(array.sum()), float(array.size)


def local_components(value: Any, strategy: Any, num_local: int) -> list[tuple[float, float]]:
    """Return one (sum, count) per local replica for one metric value."""
    if strategy is not None and not is_plain(value):
        import tensorflow as tf
        from tensorflow.python.distribute import values as distribute_values

        if isinstance(value, tf.distribute.DistributedValues) and not isinstance(
            value, distribute_values.Mirrored
        ):
            parts = [sum_count(v) for v in strategy.experimental_local_results(value)]
            if len(parts) != num_local:
                raise ValueError(f"expected {num_local} local replica values, got {len(parts)}")
            return parts
        if isinstance(value, distribute_values.Mirrored):
            value = strategy.experimental_local_results(value)[0]
    return [sum_count(value)] + [(0.0, 0.0)] * (num_local - 1)


def fingerprint(step: int, ops: dict[str, str]) -> float:
    """24-bit CRC of the step, names and ops: exact in float64 even when summed over many workers."""
    text = f"{step}|" + ",".join(f"{name}:{ops[name]}" for name in sorted(ops))
    return float(zlib.crc32(text.encode("utf-8")) & 0xFFFFFF)


def names_fingerprint(ops: dict[str, str]) -> float:
    """24-bit CRC of the names and ops alone (reduce_metrics does not know the step when it is traced)."""
    text = "reduced|" + ",".join(f"{name}:{ops[name]}" for name in sorted(ops))
    return float(zlib.crc32(text.encode("utf-8")) & 0xFFFFFF)


@dataclass
class Entry:
    """One report() call, packed: per local replica, the sums, the counts, then (step, fingerprint)."""

    step: int
    names: list[str]
    ops: dict[str, str]
    packed: list[np.ndarray]

    @property
    def signature(self) -> tuple[tuple[str, str], ...]:
        return tuple((name, self.ops[name]) for name in self.names)

    def values(self, total: np.ndarray) -> dict[str, float]:
        """The reduced values from this entry's slice of the summed vector."""
        count = len(self.names)
        sums, counts = total[:count], total[count : 2 * count]
        result = {}
        for i, name in enumerate(self.names):
            if self.ops[name] == "SUM":
                result[name] = float(sums[i])
            else:
                result[name] = float(sums[i] / counts[i]) if counts[i] else float("nan")
        return result


def shape() -> tuple[Any, int, int]:
    """(strategy or None, local replicas, workers) of this process."""
    strategy = current_strategy()
    if strategy is None and "tensorflow" in sys.modules:
        import tensorflow as tf

        if tf.distribute.has_strategy():
            strategy = tf.distribute.get_strategy()
    if strategy is None:
        if context().num_workers > 1:
            raise RuntimeError(
                "call mwms_runtime.strategy() before mwms_runtime.report() in a multi-worker job"
            )
        return None, 1, 1
    num_local = len(strategy.extended.worker_devices)
    return strategy, num_local, max(strategy.num_replicas_in_sync // num_local, 1)


def pack(metrics: Mapping[str, Any], ops: dict[str, str], step: int, strategy: Any, num_local: int) -> Entry:
    # Sorted so workers that built the dict in a different order still pack the same vector.
    names = sorted(metrics)
    per_metric = [local_components(metrics[n], strategy, num_local) for n in names]
    # The first replica also carries (step, fingerprint) so the workers can check they agree.
    header = [[float(step), fingerprint(step, ops)]] + [[0.0, 0.0]] * (num_local - 1)
    packed = [
        np.array(
            [pm[r][0] for pm in per_metric] + [pm[r][1] for pm in per_metric] + header[r], dtype=np.float64
        )
        for r in range(num_local)
    ]
    return Entry(step=step, names=names, ops=ops, packed=packed)


def identical_scalar(name: str, value: Any) -> float:
    """A value the caller says is already the same on every worker, as a float (no collective)."""
    if not is_plain(value) and "tensorflow" in sys.modules:
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

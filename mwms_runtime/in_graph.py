"""reduce_metrics(): reduce a dict of metrics inside the training step, in one collective for all of them.

Call it in the ``tf.function`` that runs the step, on what ``strategy.run`` returned (cross-replica
context). It packs every metric into one vector per replica of (sum, count) pairs plus a fingerprint of
the names and ops, and reduces it with one ``strategy.reduce("SUM", ..., axis=None)``: the same collective
a step that reduces its loss with ``strategy.reduce`` pays, whatever the number of metrics. The result is
identical on every worker, so ``report(step, reduced)`` writes it on the chief without another collective.

Values are counted as report() counts them: a PerReplica value contributes each local replica's
component; a plain tensor or Mirrored value is this worker's value (once per worker); a non-scalar value
is per-example values, every element counting (``strategy.reduce(op, value, axis=0)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mwms_runtime.reduced import ReducedMetrics
from mwms_runtime.reporting import names_fingerprint, ops_for


def _local_parts(value: Any, strategy: Any, num_local: int) -> list[Any]:
    """One tensor (or None for "nothing") per local replica for one metric value."""
    import tensorflow as tf
    from tensorflow.python.distribute import values as distribute_values

    if isinstance(value, tf.distribute.DistributedValues) and not isinstance(
        value, distribute_values.Mirrored
    ):
        parts = list(strategy.experimental_local_results(value))
        if len(parts) != num_local:
            raise ValueError(f"expected {num_local} local replica values, got {len(parts)}")
        return parts
    if isinstance(value, distribute_values.Mirrored):
        value = strategy.experimental_local_results(value)[0]
    return [value] + [None] * (num_local - 1)


def reduce_metrics(strategy: Any, metrics: Mapping[str, Any], reduce: Any = "MEAN") -> ReducedMetrics:
    """Reduce ``metrics`` over every replica of every worker in one collective, inside a tf.function.

    ``reduce`` is "MEAN" or "SUM", or a dict from metric name to op (others MEAN). Returns a
    ``ReducedMetrics`` whose ``values`` are float64 scalars, the same on every worker; return it from the
    step and pass it to ``mwms_runtime.report(step, reduced)``. Every worker must call it in the same
    step with the same names and ops, as for any collective; a disagreement on names or ops is found by
    report(), which then ends every worker with exit code 70.
    """
    import tensorflow as tf

    if not metrics:
        raise ValueError("reduce_metrics() needs at least one metric")
    # Outside strategy.scope() the default strategy's replica context is current; inside strategy.run
    # it is the strategy's own, where a cross-replica reduce cannot run.
    if tf.distribute.has_strategy() and tf.distribute.get_replica_context() is not None:
        raise RuntimeError(
            "call mwms_runtime.reduce_metrics() on what strategy.run returned (cross-replica context), "
            "not inside the function strategy.run runs"
        )
    names = sorted(metrics)  # the same packing order on every worker, whatever the dict's order
    ops = ops_for(names, reduce)
    num_local = len(strategy.extended.worker_devices)
    num_workers = max(strategy.num_replicas_in_sync // num_local, 1)
    parts = {name: _local_parts(metrics[name], strategy, num_local) for name in names}
    fingerprint = names_fingerprint(ops)

    def packed_for_replica(value_context: Any) -> Any:
        local = value_context.replica_id_in_sync_group % num_local
        zero = tf.constant(0.0, tf.float64)
        sums, counts = [], []
        for name in names:
            part = parts[name][local]
            if part is None:
                sums.append(zero)
                counts.append(zero)
                continue
            part = tf.cast(part, tf.float64)
            sums.append(tf.reduce_sum(part))
            counts.append(tf.cast(tf.size(part), tf.float64))
        # The first local replica carries the fingerprint: the sum must be num_workers times ours.
        header = tf.constant(fingerprint if local == 0 else 0.0, tf.float64)
        return tf.stack([*sums, *counts, header])

    packed = strategy.experimental_distribute_values_from_function(packed_for_replica)
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, packed, axis=None)
    count = len(names)
    sums, counts = total[:count], total[count : 2 * count]
    # MEAN divides by the number of values; a metric with none is 0 / 0 = NaN, as report() gives.
    means = sums / counts
    sum_ops = [ops[name] == "SUM" for name in names]
    if all(sum_ops):
        reduced = sums
    elif any(sum_ops):
        reduced = tf.where(tf.constant(sum_ops), sums, means)
    else:
        reduced = means
    values = dict(zip(names, tf.unstack(reduced, num=count), strict=True))
    agreed = tf.equal(total[-1], fingerprint * num_workers)
    return ReducedMetrics(values=values, agreed=agreed)

"""Test program for mwms_runtime.report(): prints the reduced values as JSON lines tests can parse.

Modes: ``reduce`` (every worker reports, also checks num_accelerators and write_path),
``one_sided`` (only worker 0 reports; worker 1 waits), ``after_tf`` (a TF op before strategy()).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

import mwms_runtime


def emit(label: str, value) -> None:
    """Print one ``RESULT`` line as JSON."""
    print("RESULT " + json.dumps({"label": label, "value": value}), flush=True)


def reduce_mode() -> None:
    """Report plain, tensor, per-replica and per-example values with SUM and MEAN."""
    strategy = mwms_runtime.strategy()
    ctx = mwms_runtime.context()
    emit("num_accelerators", strategy.cluster_resolver.num_accelerators())
    emit("same_strategy", mwms_runtime.strategy() is strategy)
    mine = float(ctx.task_index + 1)

    def replica_value():
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.cast(replica, tf.float32) + 1.0

    per_replica = strategy.run(tf.function(replica_value))
    # Worker i has (i + 1) examples, all equal to 10 * (i + 1): MEAN over examples is (10 + 40) / 3.
    per_example = tf.fill([ctx.task_index + 1], 10.0 * (ctx.task_index + 1))
    for step in (1, 2):
        values = mwms_runtime.report(
            step,
            {
                "plain_sum": mine,
                "plain_mean": mine,
                "tensor_mean": tf.constant(mine * step),
                "replica_sum": per_replica,
                "replica_mean": per_replica,
                "numpy_int": np.int64(ctx.task_index),
                "per_example_mean": per_example,
            },
            reduce={"plain_sum": "SUM", "replica_sum": "SUM", "numpy_int": "SUM"},
        )
        emit(f"step{step}", values)
    emit("default_mean", mwms_runtime.report(3, {"x": mine}))

    base = os.path.join(mwms_runtime.output_dir(), "saved", "model.keras")
    with mwms_runtime.saving(base) as path:
        with open(path, "w") as handle:
            handle.write(f"worker {ctx.task_index}\n")
        emit("write_path", path)
    emit("write_path_exists_after", os.path.exists(path))
    emit("flushed", mwms_runtime.flush(timeout=30))


def one_sided_mode() -> None:
    """Only worker 0 reports; worker 1 stays alive without calling report()."""
    strategy = mwms_runtime.strategy()
    ctx = mwms_runtime.context()
    mwms_runtime.report(1, {"loss": 1.0})  # both workers: fine
    if ctx.task_index == 0:
        started = time.monotonic()
        mwms_runtime.report(2, {"loss": 0.5})
        emit("unexpected_return", time.monotonic() - started)
    else:
        time.sleep(120)
    del strategy


def after_tf_mode() -> None:
    """Check the resolver's GPU count, run a TensorFlow op, then ask for the strategy: must raise."""
    from mwms_runtime.strategy_factory import _make_resolver

    emit("resolver_gpus", {str(n): _make_resolver(n).num_accelerators() for n in (0, 3)})
    tf.constant(1.0) + 1.0
    try:
        mwms_runtime.strategy()
    except RuntimeError as exc:
        emit("error", str(exc))
        return
    emit("error", None)


if __name__ == "__main__":
    {"reduce": reduce_mode, "one_sided": one_sided_mode, "after_tf": after_tf_mode}[sys.argv[1]]()

"""Test program for mwms_runtime.report(): prints the reduced values as JSON lines tests can parse.

Modes: ``reduce`` (every worker reports, also checks the strategy's devices, strategy() arguments and
write_path, then the workers report different steps and names, which must end both with exit code 70),
``one_sided`` (only worker 0 reports; worker 1 waits), ``after_tf`` (a TF op before strategy(), and the
devices MWMS uses for a given GPU count), ``mismatch_length`` (workers report different numbers of metrics).
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
    emit("local_devices", [d.rsplit("/", 1)[-1] for d in strategy.extended.worker_devices])
    emit("same_strategy", mwms_runtime.strategy() is strategy)
    emit("same_arguments", mwms_runtime.strategy(communication="auto") is strategy)
    try:
        mwms_runtime.strategy(communication="RING", bytes_per_pack=7)
        emit("different_arguments", None)
    except ValueError as exc:
        emit("different_arguments", str(exc))
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
    # Left for the exit path to remove.
    emit("uncleaned_write_path", mwms_runtime.write_path(base))

    # Worker 0 reports "a" at step 4, worker 1 "b" at step 5: both must stop with exit code 70.
    if ctx.task_index == 0:
        mwms_runtime.report(4, {"a": 1.0})
    else:
        mwms_runtime.report(5, {"b": 2.0})
    emit("unexpected_return", True)


def mismatch_length_mode() -> None:
    """Worker 0 reports one metric, worker 1 two."""
    mwms_runtime.strategy()
    ctx = mwms_runtime.context()
    metrics = {"a": 1.0} if ctx.task_index == 0 else {"a": 1.0, "b": 2.0}
    mwms_runtime.report(1, metrics)
    emit("unexpected_return", True)


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
    """Run a TensorFlow op, then ask for the strategy: must raise. Then check the devices MWMS uses."""
    from mwms_runtime.strategy_factory import _make_resolver

    tf.constant(1.0) + 1.0
    try:
        mwms_runtime.strategy()
        emit("error", None)
    except RuntimeError as exc:
        emit("error", str(exc))
    # Without TF_CONFIG MWMS runs locally and tolerates a started eager context. TensorFlow sees no GPU
    # here, so GPU devices can only come from the count the resolver reports.
    devices = {}
    for gpus in (0, 2):
        built = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=_make_resolver(gpus))
        devices[str(gpus)] = [d.rsplit("/", 1)[-1] for d in built.extended.worker_devices]
    emit("devices_for_gpus", devices)


if __name__ == "__main__":
    modes = {
        "reduce": reduce_mode,
        "one_sided": one_sided_mode,
        "after_tf": after_tf_mode,
        "mismatch_length": mismatch_length_mode,
    }
    modes[sys.argv[1]]()

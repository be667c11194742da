"""Test program: one process, a MirroredStrategy over two logical CPUs (two replicas on one worker).

Reduces uneven per-replica values through mwms_runtime.report() and reduce_metrics(), then trains with model.fit and
steps_per_execution=3 under MetricsCallback(every_n_batches=2). Prints ``RESULT`` JSON lines.
"""

from __future__ import annotations

import json

import numpy as np
import tensorflow as tf

import mwms_runtime


def emit(label: str, value) -> None:
    """Print one ``RESULT`` line as JSON."""
    print("RESULT " + json.dumps({"label": label, "value": value}), flush=True)


def main() -> None:
    """Run the reduction and the fit checks."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    emit("replicas", strategy.num_replicas_in_sync)

    vectors = [[1.0, 2.0, 3.0], [4.0]]
    uneven = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(vectors[ctx.replica_id_in_sync_group])
    )
    scalars = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(float(ctx.replica_id_in_sync_group + 1))
    )
    with strategy.scope():
        values = mwms_runtime.report(
            1,
            {"vector_mean": uneven, "vector_sum": uneven, "scalar_mean": scalars, "scalar_sum": scalars},
            reduce={"vector_sum": "SUM", "scalar_sum": "SUM"},
        )
    emit("reduced", values)

    @tf.function
    def reduce_in_graph(uneven, scalars):
        return mwms_runtime.reduce_metrics(
            strategy,
            {"vector_mean": uneven, "vector_sum": uneven, "scalar_sum": scalars, "worker": tf.constant(7.0)},
            reduce={"vector_sum": "SUM", "scalar_sum": "SUM"},
        )

    emit("reduced_in_graph", mwms_runtime.report(2, reduce_in_graph(uneven, scalars)))

    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, size=512)
    points = (np.where(labels[:, None] == 1, 1.5, -1.5) + rng.normal(size=(512, 2))).astype(np.float32)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(2,))])
        model.compile(
            optimizer=tf.keras.optimizers.SGD(learning_rate=0.1),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=3,
        )
    dataset = tf.data.Dataset.from_tensor_slices((points, labels)).repeat().batch(16)
    model.fit(
        dataset,
        epochs=2,
        steps_per_epoch=7,
        callbacks=[mwms_runtime.MetricsCallback(every_n_batches=2, global_batch_size=16)],
        verbose=0,
    )
    emit("flushed", mwms_runtime.flush(timeout=30))


if __name__ == "__main__":
    main()

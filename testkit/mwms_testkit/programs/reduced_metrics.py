"""Test program for reduce_metrics() and report() of already-reduced values; prints ``RESULT`` JSON lines.

Every report() collective is counted (``collectives``): reduced values must need none. The program
reduces metrics inside a tf.function step, reports them, lets only worker 0 report once more (no
collective, so no hang), trains a few batches of ``fit`` under MetricsCallback, and ends with the workers
reducing the same name with different ops, which must end both with exit code 70.
"""

from __future__ import annotations

import json

import numpy as np
import tensorflow as tf

import mwms_runtime
from mwms_runtime import reporting

collectives = 0
_all_reduce_sum = reporting._all_reduce_sum


def counting_all_reduce_sum(*args, **kwargs):
    """report()'s collective, counted."""
    global collectives
    collectives += 1
    return _all_reduce_sum(*args, **kwargs)


reporting._all_reduce_sum = counting_all_reduce_sum


def emit(label: str, value) -> None:
    """Print one ``RESULT`` line as JSON."""
    print("RESULT " + json.dumps({"label": label, "value": value}), flush=True)


def floats(values: dict) -> dict[str, float]:
    """Tensors to floats, for JSON."""
    return {name: float(value) for name, value in values.items()}


def main() -> None:
    """Run the checks the module docstring lists."""
    strategy = mwms_runtime.strategy()
    ctx = mwms_runtime.context()
    worker = float(ctx.task_index + 1)
    global_batch = 4 * strategy.num_replicas_in_sync
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(2,))])
        optimizer = tf.keras.optimizers.SGD(learning_rate=0.1)
    rng = np.random.default_rng(ctx.task_index)
    points = rng.normal(size=(64, 2)).astype(np.float32)
    labels = rng.integers(0, 2, size=64)
    dataset = tf.data.Dataset.from_tensor_slices((points, labels)).repeat().batch(4)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    @tf.function
    def train_step(iterator, ops):
        def step_fn(inputs):
            features, labels = inputs
            with tf.GradientTape() as tape:
                logits = model(features, training=True)
                per_example = tf.keras.losses.sparse_categorical_crossentropy(
                    labels, logits, from_logits=True
                )
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            return per_example, tf.cast(replica, tf.float32) + 1.0

        per_example, per_replica = strategy.run(step_fn, args=(next(iterator),))
        # Worker i holds (i + 1) examples of 10 * (i + 1): MEAN over examples is (10 + 40) / 3.
        uneven = tf.fill([ctx.task_index + 1], 10.0 * worker)
        reduced = mwms_runtime.reduce_metrics(
            strategy,
            {
                "loss": per_example,
                "replica_sum": per_replica,
                "worker_mean": tf.constant(worker),
                "per_example_mean": uneven,
            },
            reduce=ops,
        )
        in_graph = strategy.reduce("MEAN", per_example, axis=0)
        return in_graph, reduced

    ops = {"replica_sum": "SUM"}
    for step in (1, 2, 3):
        in_graph, reduced = train_step(iterator, ops)
        assert isinstance(reduced, mwms_runtime.ReducedMetrics), type(reduced)
        written = mwms_runtime.report(step, reduced)
        emit(
            f"step{step}", {"in_graph": float(in_graph), "written": written, "graph": floats(reduced.values)}
        )

    # No collective: worker 0 alone may report already-reduced values without waiting for worker 1.
    if ctx.task_index == 0:
        emit("one_sided", mwms_runtime.report(4, reduced))
    emit("explicit", mwms_runtime.report(5, {"x": tf.constant(2.5), "y": 7}, reduced=True))
    try:
        mwms_runtime.report(6, {"p": per_replica_value(strategy)}, reduced=True)
        emit("per_replica_error", None)
    except ValueError as exc:
        emit("per_replica_error", str(exc))

    with strategy.scope():
        fitted = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(2,))])
        fitted.compile(
            optimizer=tf.keras.optimizers.SGD(learning_rate=0.1),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    fitted.fit(
        dataset.batch(1).unbatch(),
        epochs=1,
        steps_per_epoch=3,
        callbacks=[mwms_runtime.MetricsCallback(global_batch_size=global_batch)],
        verbose=0,
    )
    emit("collectives", collectives)
    emit("flushed", mwms_runtime.flush(timeout=30))

    # The workers reduce "loss" with different ops: report() must end both with exit code 70.
    _, reduced = train_step(iterator, {"replica_sum": "SUM", "loss": "SUM" if ctx.task_index else "MEAN"})
    mwms_runtime.report(7, reduced)
    emit("unexpected_return", True)


def per_replica_value(strategy):
    """A PerReplica value, different on every replica."""
    return strategy.experimental_distribute_values_from_function(
        lambda value_context: tf.constant(float(value_context.replica_id_in_sync_group))
    )


if __name__ == "__main__":
    main()

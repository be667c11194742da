"""Keras model.fit under MultiWorkerMirroredStrategy: two Gaussian blobs, a small MLP, metrics, a saved model.

Grown from the example on TensorFlow's MultiWorkerMirroredStrategy page. Runs unchanged alone
(``python train.py``) or on every worker of an mwms job (TF_CONFIG set by the agent).
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import tensorflow as tf

import mwms_runtime  # selects tf_keras for tf.keras (read when tf.keras is first used)

SEED = 7


def make_blobs(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Return ``count`` 2-D points from two Gaussian blobs and their 0/1 labels."""
    labels = rng.integers(0, 2, size=count)
    centers = np.array([[-1.5, -1.0], [1.5, 1.0]], dtype=np.float32)
    points = centers[labels] + rng.normal(scale=0.8, size=(count, 2)).astype(np.float32)
    return points.astype(np.float32), labels.astype(np.int64)


def main() -> None:
    """Train, report metrics, save the model on every worker (only the chief's copy is kept)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=10)
    parser.add_argument("--batch-size-per-replica", type=int, default=16)
    args = parser.parse_args()

    strategy = mwms_runtime.strategy()  # before any other TensorFlow API
    tf.random.set_seed(SEED)
    global_batch = args.batch_size_per_replica * strategy.num_replicas_in_sync

    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.layers.Dense(16, activation="relu", input_shape=(2,)),
                tf.keras.layers.Dense(2),
            ]
        )
        model.compile(
            optimizer=tf.keras.optimizers.SGD(learning_rate=0.1),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = input_context.get_per_replica_batch_size(global_batch)
        points, labels = make_blobs(np.random.default_rng(SEED + input_context.input_pipeline_id), 1024)
        dataset = tf.data.Dataset.from_tensor_slices((points, labels))
        return dataset.shuffle(1024, seed=SEED).repeat().batch(batch, drop_remainder=True)

    dist_dataset = strategy.distribute_datasets_from_function(dataset_fn)
    history = model.fit(
        dist_dataset,
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        callbacks=[mwms_runtime.MetricsCallback(every_n_batches=1, global_batch_size=global_batch)],
        verbose=2,
    )

    with mwms_runtime.saving(os.path.join(mwms_runtime.output_dir(), "model.keras")) as path:
        model.save(path)
    mwms_runtime.flush()
    print(f"FINAL loss={history.history['loss'][-1]:.4f} steps={args.epochs * args.steps_per_epoch}")


if __name__ == "__main__":
    main()

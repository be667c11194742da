"""Custom training loop under MultiWorkerMirroredStrategy, with metrics and resumable checkpoints.

Grown from the custom-loop example on TensorFlow's MultiWorkerMirroredStrategy page: ``tf.function``,
``GradientTape``, ``strategy.run`` and ``optimizer.apply_gradients``. The step reduces its metrics itself
with ``mwms_runtime.reduce_metrics`` (one in-graph collective for all of them, like ``strategy.reduce``)
and ``mwms_runtime.report`` hands the result to the chief's writer without another collective; a ``tf.train.CheckpointManager`` saves on every worker (the chief into the job's
checkpoint dir, the others into temporary paths) and a restarted job resumes from the latest checkpoint.
"""

from __future__ import annotations

import argparse

import numpy as np
import tensorflow as tf

import mwms_runtime  # selects tf_keras for tf.keras (read when tf.keras is first used)

SEED = 11


def make_blobs(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Return ``count`` 2-D points from two Gaussian blobs and their 0/1 labels."""
    labels = rng.integers(0, 2, size=count)
    centers = np.array([[-1.5, -1.0], [1.5, 1.0]], dtype=np.float32)
    points = centers[labels] + rng.normal(scale=0.8, size=(count, 2)).astype(np.float32)
    return points.astype(np.float32), labels.astype(np.int64)


def main() -> None:
    """Train for --steps steps in total, resuming from the job's latest checkpoint when there is one."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size-per-replica", type=int, default=16)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--print-every", type=int, default=10)
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
        optimizer = tf.keras.optimizers.SGD(learning_rate=0.1)
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)

    checkpoint_dir = mwms_runtime.checkpoint_dir()
    latest = tf.train.latest_checkpoint(checkpoint_dir)
    if latest:
        checkpoint.restore(latest)
    start = int(step.numpy())
    # Every worker must resume from the same step, so all must see the chief's checkpoint dir. report()
    # is the check: it compares the workers' steps (their sum and a fingerprint of step and names) and,
    # when they differ, ends every worker with exit code 70 naming the step each one reported.
    mwms_runtime.report(start, {"resumed_from_step": start})
    manager_dir = mwms_runtime.write_path(checkpoint_dir)
    manager = tf.train.CheckpointManager(checkpoint, manager_dir, max_to_keep=2)

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = input_context.get_per_replica_batch_size(global_batch)
        points, labels = make_blobs(np.random.default_rng(SEED + input_context.input_pipeline_id), 1024)
        dataset = tf.data.Dataset.from_tensor_slices((points, labels))
        return dataset.shuffle(1024, seed=SEED).repeat().batch(batch, drop_remainder=True)

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

    @tf.function
    def train_step(iterator):
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
            return per_example

        per_example = strategy.run(step_fn, args=(next(iterator),))
        # MEAN over every example of every replica, reduced here in the step's graph in one collective
        # (add more metrics to the dict at no extra collective); identical on every worker afterwards.
        return per_example, mwms_runtime.reduce_metrics(strategy, {"loss": per_example})

    loss = float("nan")
    for current in range(start + 1, args.steps + 1):
        per_example, reduced = train_step(iterator)
        loss = mwms_runtime.report(current, reduced)["loss"]  # the chief writes it; no second collective
        step.assign(current)
        if current % args.checkpoint_every == 0 or current == args.steps:
            manager.save(checkpoint_number=current)
        if current % args.print_every == 0:
            local = np.concatenate([t.numpy() for t in strategy.experimental_local_results(per_example)])
            print(f"step={current} local_loss={local.mean():.6f} loss={loss:.6f}", flush=True)

    mwms_runtime.cleanup_write_path(manager_dir)
    mwms_runtime.flush()
    print(f"FINAL loss={loss:.4f} steps={args.steps} resumed_from={start}")


if __name__ == "__main__":
    main()

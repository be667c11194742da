"""Test program for mwms_runtime.preemption_handler(): a custom loop that saves on SIGTERM and resumes.

Prints ``RESUMED <step>`` once the handler has restored, and ``STEP <n>`` after step n is reported (the
test sends SIGTERM once it sees a few). Reports a per-replica loss with report() every step, calling
``save_checkpoint_if_preempted()`` after it, so the step a preemption saves at is reported too.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import tensorflow as tf

import mwms_runtime


def main() -> None:
    """Train --steps steps in total, --delay seconds apart, resuming where a preemption saved."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument(
        "--manager",
        action="store_true",
        help="give the handler a CheckpointManager that also saves every 10 steps",
    )
    args = parser.parse_args()

    strategy = mwms_runtime.strategy()
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(4, input_shape=(2,)), tf.keras.layers.Dense(1)])
        optimizer = tf.keras.optimizers.SGD(learning_rate=0.05)
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    manager = None
    if args.manager:
        manager_dir = mwms_runtime.write_path(mwms_runtime.checkpoint_dir())
        manager = tf.train.CheckpointManager(checkpoint, manager_dir, max_to_keep=2)
    handler = mwms_runtime.preemption_handler(manager or checkpoint)
    start = int(step.numpy())
    print(f"RESUMED {start} ", flush=True)

    global_batch = 8 * strategy.num_replicas_in_sync

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        rng = np.random.default_rng(input_context.input_pipeline_id)
        points = rng.normal(size=(256, 2)).astype(np.float32)
        targets = points @ np.array([[2.0], [-1.0]], dtype=np.float32)
        batch = input_context.get_per_replica_batch_size(global_batch)
        return tf.data.Dataset.from_tensor_slices((points, targets)).repeat().batch(batch)

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

    @tf.function
    def train_step(iterator):
        def step_fn(inputs):
            features, targets = inputs
            with tf.GradientTape() as tape:
                per_example = tf.reduce_mean(tf.square(model(features) - targets), axis=1)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return per_example

        return strategy.run(step_fn, args=(next(iterator),))

    with handler.watch_preemption_scope():
        for current in range(start + 1, args.steps + 1):
            per_example = train_step(iterator)
            step.assign(current)
            mwms_runtime.report(current, {"loss": per_example})
            print(f"STEP {current}", flush=True)
            if manager is None:
                handler.save_checkpoint_if_preempted()
            else:
                if current % 10 == 0:
                    manager.save(checkpoint_number=current)
                handler.save_checkpoint_if_preempted(checkpoint_number=current)  # for manager.save
            time.sleep(args.delay)
    mwms_runtime.flush()
    print(f"DONE {args.steps}", flush=True)


if __name__ == "__main__":
    main()

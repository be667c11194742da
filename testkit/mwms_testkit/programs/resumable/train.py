"""A slow, resumable custom loop for fault-tolerance tests: checkpoints every N steps, reports loss.

Prints `RESUMED <step>` at start and `DONE steps=<n>` at the end. The checkpoint is written with
tf.train.CheckpointManager through mwms_runtime.write_path, so only the chief's lands in MWMS_CHECKPOINT_DIR.
"""

import argparse
import time

import numpy as np
import tensorflow as tf

import mwms_runtime

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--every", type=int, default=10)
parser.add_argument("--delay", type=float, default=0.1)
args = parser.parse_args()

strategy = mwms_runtime.strategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(1,))])
    optimizer = tf.keras.optimizers.SGD(0.05)
    step = tf.Variable(0, dtype=tf.int64, trainable=False)
checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
latest = tf.train.latest_checkpoint(mwms_runtime.checkpoint_dir())
if latest:
    checkpoint.restore(latest)
start = int(step.numpy())
print(f"RESUMED {start}", flush=True)
manager_dir = mwms_runtime.write_path(mwms_runtime.checkpoint_dir())
manager = tf.train.CheckpointManager(checkpoint, manager_dir, max_to_keep=2)

x = np.linspace(0, 1, 64, dtype=np.float32).reshape(-1, 1)
data = tf.data.Dataset.from_tensor_slices((x, 2 * x + 1)).repeat().batch(16)
iterator = iter(strategy.experimental_distribute_dataset(data))


@tf.function
def train_step(batch):
    def step_fn(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(features) - labels))
        optimizer.apply_gradients(
            zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        )
        return loss

    return strategy.run(step_fn, args=(batch,))


for current in range(start + 1, args.steps + 1):
    loss = train_step(next(iterator))
    mwms_runtime.report(current, {"loss": loss})
    step.assign(current)
    if current % args.every == 0:
        manager.save(checkpoint_number=current)
        print(f"SAVED {current}", flush=True)
    time.sleep(args.delay)

mwms_runtime.flush()
print(f"DONE steps={int(step.numpy())}", flush=True)

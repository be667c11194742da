"""A 2-worker MultiWorkerMirroredStrategy job whose worker 1 sleeps before its first all-reduce, so worker
0 waits in the collective: what hang detection and stack dumps are tested on.

Each worker prints `WAITING` once it is where it stays (worker 0 right before its first step, worker 1
right before its sleep); `--steps` steps follow when nobody sleeps (--sleep 0).
"""

import argparse
import json
import os
import time

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--sleep", type=float, default=600.0, help="seconds worker 1 sleeps before step 1")
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()

index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(1,))])
    optimizer = tf.keras.optimizers.SGD(0.05)
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


def wait_before_first_allreduce(seconds):
    print("WAITING", flush=True)
    time.sleep(seconds)


if index == 1 and args.sleep > 0:
    wait_before_first_allreduce(args.sleep)
elif index == 0:
    print("WAITING", flush=True)
batch = next(iterator)  # taken before the step, so worker 0 waits in the step's collective, not in input
for step in range(1, args.steps + 1):
    train_step(batch)
    print(f"STEP {step}", flush=True)
print("DONE", flush=True)

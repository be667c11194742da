"""Test program for mwms_runtime.backup_and_restore(): model.fit that saves on SIGTERM and resumes.

Prints ``FIRST epoch=<e> batch=<b>`` at the first batch fit runs (where it resumed) and
``BATCH epoch=<e> batch=<b>`` at each batch end, before the backup callback (last in the list) may save
there and exit; MetricsCallback reports every batch.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import tensorflow as tf

import mwms_runtime


class Progress(tf.keras.callbacks.Callback):
    """Prints where fit starts and each batch it finishes, --delay seconds apart."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.epoch = -1
        self.first = True

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.first:
            print(f"FIRST epoch={self.epoch} batch={batch}", flush=True)
            self.first = False

    def on_train_batch_end(self, batch, logs=None):
        print(f"BATCH epoch={self.epoch} batch={batch}", flush=True)
        time.sleep(self.delay)


def main() -> None:
    """Fit --epochs epochs of --steps batches, resuming where a preemption saved."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()

    strategy = mwms_runtime.strategy()
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(4, input_shape=(2,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=0.05), loss="mse")
    rng = np.random.default_rng(3)
    points = rng.normal(size=(256, 2)).astype(np.float32)
    targets = points @ np.array([[2.0], [-1.0]], dtype=np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((points, targets)).repeat().batch(8 * 2)
    callbacks = [
        Progress(args.delay),
        mwms_runtime.MetricsCallback(),
        mwms_runtime.backup_and_restore(),  # last: it may save and exit at a batch end
    ]
    model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps, callbacks=callbacks, verbose=0)
    mwms_runtime.flush()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()

"""A healthy 2-worker `fit` loop that runs until cancelled: what a stack dump must not call "not in a
collective" (tests/system/browser/test_dashboard_healthy_stacks_e2e.py, tests/system/e2e/test_stacks_snapshots.py).

Most of each step is spent in the train function (where the all-reduce runs); between two executions the
loop is in Keras' own Python for a moment, which is where a single snapshot can catch it. Each worker
prints FITTING once its second epoch begins (past the first all-reduce).
"""

import os

import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input((256,)),
            tf.keras.layers.Dense(256, activation="relu"),
            tf.keras.layers.Dense(256, activation="relu"),
            tf.keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=10)
features = np.random.default_rng(int(os.environ.get("MWMS_TASK_INDEX", "0"))).random(
    (512, 256), dtype=np.float32
)
data = tf.data.Dataset.from_tensor_slices((features, features[:, :1])).repeat().batch(64)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
data = data.with_options(options)


class AnnounceFitting(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            print("FITTING", flush=True)


model.fit(data, epochs=100_000, steps_per_epoch=20, verbose=0, callbacks=[AnnounceFitting()])

"""Test program: a tf_keras fit that never mentions mwms (argv[1] "own": it passes its own MetricsCallback).

Prints ``CALLBACKS <class names>``: the callbacks fit was given, as tf_keras's CallbackList got them.
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf

callbacks: list = []
if sys.argv[1:] == ["own"]:
    import mwms_runtime

    callbacks.append(mwms_runtime.MetricsCallback(every_n_batches=2))

given_to_fit: list[str] = []
original_init = tf.keras.callbacks.CallbackList.__init__


def recording_init(self, callbacks=None, *args, **kwargs):
    given_to_fit.extend(type(callback).__name__ for callback in callbacks or [])
    original_init(self, callbacks, *args, **kwargs)


tf.keras.callbacks.CallbackList.__init__ = recording_init

model = tf.keras.Sequential([tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
x = np.ones((16, 4), dtype=np.float32)
y = np.zeros((16, 1), dtype=np.float32)
model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=callbacks or None)
print("CALLBACKS " + " ".join(given_to_fit), flush=True)

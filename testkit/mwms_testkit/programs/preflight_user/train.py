"""A tiny MWMS program: one all-reduce over the gang, on the ports the preflight check has just used."""

import time

import mwms_runtime

started = time.monotonic()
strategy = mwms_runtime.strategy()

import tensorflow as tf  # noqa: E402

values = strategy.experimental_distribute_values_from_function(lambda _: tf.constant([1.0]))
total = strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None)
print(f"USER_OK sum={float(total[0]):g} after {time.monotonic() - started:.2f} s", flush=True)

"""Test program for report()'s batching: per-replica values reduced a batch of calls per collective.

Every report() collective is counted (``collectives``). Modes: ``batched`` (60 steps reported without
reading the results, then the program ends without flush(): the exit path writes the last batch),
``reading`` (the results are read every step: each call returns its own step's values), ``mismatch``
(the workers report different names inside a batch: both must end with exit code 70), ``crash``
(worker 0 raises with calls pending: it must end at once with its traceback, not wait for worker 1).
"""

from __future__ import annotations

import json
import sys
import time

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


def main(mode: str) -> None:
    """Report steps 1.. with worker i's value step * (i + 1) per replica and (i + 1) as a SUM."""
    strategy = mwms_runtime.strategy()
    task = mwms_runtime.context().task_index

    @tf.function
    def per_replica_value(step):
        return strategy.run(lambda: tf.cast(step, tf.float32) * (task + 1))

    if mode == "batched":
        for step in range(1, 61):
            mwms_runtime.report(step, {"x": per_replica_value(step), "n": task + 1}, reduce={"n": "SUM"})
        emit("collectives", collectives)
        emit("limit", reporting._batch.limit)
    elif mode == "reading":
        returned = []
        for step in range(1, 21):
            values = mwms_runtime.report(step, {"x": per_replica_value(step)})
            returned.append([values.step, values["x"]])
        emit("returned", returned)
        emit("collectives", collectives)
        emit("waited", mwms_runtime.report(21, {"x": per_replica_value(21)}, wait=True))
    elif mode == "mismatch":
        for step in range(1, 31):
            mwms_runtime.report(step, {"x": 1.0})
        # Worker 1 reports a new name (a call that ends its batch at once); worker 0 the usual one.
        mwms_runtime.report(31, {"x": 1.0} if task == 0 else {"y": 1.0})
        mwms_runtime.flush(timeout=30)
        emit("unexpected_return", True)
    elif mode == "crash":
        for step in range(1, 11):
            mwms_runtime.report(step, {"x": 1.0})
        if task == 0:
            raise RuntimeError("the training step failed")
        time.sleep(60)


if __name__ == "__main__":
    main(sys.argv[1])

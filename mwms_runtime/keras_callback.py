"""MetricsCallback: report model.fit's batch and epoch logs through mwms_runtime.report().

Inside ``fit`` each worker's logs already hold values reduced over all replicas (tf_keras reduces them
with ``strategy.reduce`` in the train step), identical on every worker. So they go to
``report(..., reduced=True)``: the chief writes them and no second collective runs. The timing metrics
(``step_time_seconds``, ``examples_per_second``) are the chief's own wall-clock figures.
"""

from __future__ import annotations

import numbers
import time
from typing import Any

import numpy as np
import tensorflow as tf

from mwms.metrics_line import EPOCH_PREFIX
from mwms_runtime.reporting import report


def _scalar_logs(logs: dict[str, Any] | None, prefix: str = "") -> dict[str, float]:
    scalars = {}
    for name, value in (logs or {}).items():
        if hasattr(value, "numpy"):
            value = value.numpy()
        if isinstance(value, numbers.Number) or (isinstance(value, np.ndarray) and value.size == 1):
            scalars[prefix + name] = float(np.asarray(value).reshape(()))
    return scalars


class MetricsCallback(tf.keras.callbacks.Callback):
    """Reports batch logs when the global step crosses a multiple of ``every_n_batches``, and epoch logs.

    The global step counts batches, ``epoch * steps_per_epoch + batch + 1``: with ``steps_per_execution``
    k > 1 Keras calls the callback once per k batches with the last batch's index, so a report is made
    at the first call at or past each multiple. Epoch logs are named ``epoch_<name>`` with step = the
    epoch index Keras passes (0-based, as Keras' TensorBoard callback does): a per-epoch series on an
    axis of its own (mwms/metrics_line.py ``axis``). Batch reports add
    ``step_time_seconds`` (mean wall time per batch since the previous report) and, when
    ``global_batch_size`` is given, ``examples_per_second``.
    """

    def __init__(self, every_n_batches: int = 1, global_batch_size: int | None = None) -> None:
        super().__init__()
        if every_n_batches < 1:
            raise ValueError("every_n_batches must be >= 1")
        self.every_n_batches = every_n_batches
        self.global_batch_size = global_batch_size
        self._epoch_offset = 0  # global step before this epoch's first batch
        self._last_step = 0  # global step at the previous callback call
        self._window_start = 0.0
        self._window_step = 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Start a timing window at this epoch's first global step (continuing from ``initial_epoch``)."""
        steps = (self.params or {}).get("steps")
        # Without a known epoch length, count on from the batches seen so far.
        self._epoch_offset = epoch * int(steps) if steps else self._last_step
        self._last_step = self._epoch_offset
        self._window_start = time.perf_counter()
        self._window_step = self._epoch_offset

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Report this batch's logs when the global step reached or passed a multiple of every_n_batches."""
        step = self._epoch_offset + int(batch) + 1
        previous, self._last_step = self._last_step, step
        if step // self.every_n_batches == previous // self.every_n_batches or step <= self._window_step:
            return
        step_time = (time.perf_counter() - self._window_start) / (step - self._window_step)
        scale = self._batch_log_scale()
        metrics = {name: value * scale for name, value in _scalar_logs(logs).items()}
        metrics["step_time_seconds"] = step_time
        if self.global_batch_size and step_time > 0:
            metrics["examples_per_second"] = self.global_batch_size / step_time
        report(step, metrics, reduced=True)
        self._window_start = time.perf_counter()
        self._window_step = step

    def _batch_log_scale(self) -> float:
        """1 / replicas when fit's batch logs are summed over replicas, else 1.

        Under a multi-worker MultiWorkerMirroredStrategy, tf_keras reduces the batch logs with reduction
        "auto" (= "sum" off TPUs) as ``strategy.reduce("SUM", ...)`` over every replica. Each replica
        already holds the synchronised metric result, so the sum is the true value times
        num_replicas_in_sync (an accuracy of 1.96 with two workers). Other strategies (MirroredStrategy,
        MWMS without TF_CONFIG) pass the synchronised value through unchanged. Epoch logs are read from
        the metrics directly and need no correction.
        """
        model = self.model
        method = getattr(model, "distribute_reduction_method", "auto")
        strategy: Any = getattr(model, "distribute_strategy", None)
        if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            return 1.0
        if strategy.extended._in_multi_worker_mode() and method in ("auto", "sum"):
            return 1.0 / (strategy.num_replicas_in_sync or 1)
        return 1.0

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Report the epoch's logs as ``epoch_<name>`` at step = epoch."""
        metrics = _scalar_logs(logs, prefix=EPOCH_PREFIX)
        if metrics:
            report(epoch, metrics, reduced=True)

"""MetricsCallback: report model.fit's batch and epoch logs through mwms_runtime.report().

Inside ``fit`` each worker's logs already hold values aggregated over all replicas; they still go through
report() so every worker agrees and only the chief writes. report() is a collective, and every worker
calls it at the same batches because the batch counter is the same on every worker.
"""

from __future__ import annotations

import numbers
import time
from typing import Any

import numpy as np
import tensorflow as tf

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
    """Reports batch logs every ``every_n_batches`` batches (step = global batch count) and epoch logs.

    Epoch logs are named ``epoch_<name>`` with step = the epoch index Keras passes (0-based, as Keras'
    TensorBoard callback does). Batch reports add ``step_time_seconds`` (mean wall time per batch since
    the previous report) and, when ``global_batch_size`` is given, ``examples_per_second``.
    """

    def __init__(self, every_n_batches: int = 1, global_batch_size: int | None = None) -> None:
        super().__init__()
        if every_n_batches < 1:
            raise ValueError("every_n_batches must be >= 1")
        self.every_n_batches = every_n_batches
        self.global_batch_size = global_batch_size
        self._global_batch = 0
        self._started = False
        self._window_start = 0.0
        self._window_batches = 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Start a timing window; on the first epoch, continue the batch count from ``initial_epoch``."""
        steps = (self.params or {}).get("steps")
        if not self._started and steps:
            self._global_batch = epoch * int(steps)
        self._started = True
        self._window_start = time.perf_counter()
        self._window_batches = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Report this batch's logs when the global batch count is a multiple of every_n_batches."""
        self._global_batch += 1
        self._window_batches += 1
        if self._global_batch % self.every_n_batches:
            return
        step_time = (time.perf_counter() - self._window_start) / self._window_batches
        scale = self._batch_log_scale()
        metrics = {name: value * scale for name, value in _scalar_logs(logs).items()}
        metrics["step_time_seconds"] = step_time
        if self.global_batch_size and step_time > 0:
            metrics["examples_per_second"] = self.global_batch_size / step_time
        report(self._global_batch, metrics)
        self._window_start = time.perf_counter()
        self._window_batches = 0

    def _batch_log_scale(self) -> float:
        """1 / replicas when fit's batch logs are summed over replicas, else 1.

        tf_keras reduces the per-replica batch logs with reduction "auto", which is "sum" on every strategy
        but TPUs. Each replica already holds the synchronised metric result, so the sum is the true value
        times num_replicas_in_sync (an accuracy of 1.96 with two workers). Epoch logs are read from the
        metrics directly and need no correction.
        """
        model = self.model
        method = getattr(model, "distribute_reduction_method", "auto")
        strategy = getattr(model, "distribute_strategy", None)
        replicas = getattr(strategy, "num_replicas_in_sync", 1) or 1
        is_tpu = "TPU" in type(strategy).__name__
        if method == "sum" or (method == "auto" and not is_tpu):
            return 1.0 / replicas
        return 1.0

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Report the epoch's logs as ``epoch_<name>`` at step = epoch."""
        metrics = _scalar_logs(logs, prefix="epoch_")
        if metrics:
            report(epoch, metrics)

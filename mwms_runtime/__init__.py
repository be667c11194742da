"""mwms_runtime: what a training program imports to run under the mwms control plane.

It builds the MultiWorkerMirroredStrategy from the job's environment, reduces and records metrics
(``report``, ``reduce_metrics`` inside the training step, ``MetricsCallback``), hands out race-free
save paths and saves on the agent's preemption signal (``preemption_handler``, ``backup_and_restore``). Importing it does not import
TensorFlow, but selects the tf_keras (Keras 2) implementation of ``tf.keras`` (unless TF_USE_LEGACY_KERAS
is already set), which MWMS's ``model.fit`` on distributed datasets needs. TensorFlow reads that
variable when ``tf.keras`` is first used, so import mwms_runtime before touching ``tf.keras``.
"""

from __future__ import annotations

import os

from mwms.task_environment import DEFAULTED_ENV

for _name, _default in DEFAULTED_ENV.items():  # as the agent does for its tasks
    os.environ.setdefault(_name, _default)

from mwms_runtime.env import TaskContext, checkpoint_dir, context, output_dir  # noqa: E402
from mwms_runtime.in_graph import reduce_metrics  # noqa: E402
from mwms_runtime.preemption import backup_and_restore, preemption_handler  # noqa: E402
from mwms_runtime.reduced import ReducedMetrics  # noqa: E402
from mwms_runtime.reporting import flush, report, report_timeout_seconds  # noqa: E402
from mwms_runtime.save_paths import cleanup_write_path, saving, write_path  # noqa: E402
from mwms_runtime.strategy_factory import communication_options, strategy  # noqa: E402

__all__ = [
    "MetricsCallback",
    "ReducedMetrics",
    "TaskContext",
    "backup_and_restore",
    "checkpoint_dir",
    "cleanup_write_path",
    "communication_options",
    "context",
    "flush",
    "output_dir",
    "preemption_handler",
    "reduce_metrics",
    "report",
    "report_timeout_seconds",
    "saving",
    "strategy",
    "write_path",
]


def __getattr__(name: str):
    # The callback subclasses a tf_keras class, so it is imported only when asked for.
    if name == "MetricsCallback":
        from mwms_runtime.keras_callback import MetricsCallback

        return MetricsCallback
    raise AttributeError(f"module 'mwms_runtime' has no attribute {name!r}")

"""Preemption without losing a step: TensorFlow's PreemptionCheckpointHandler, set up for the mwms agent.

To preempt a job the agent sends SIGTERM to every worker of the gang at once and SIGKILL
``MWMS_PREEMPTION_GRACE_S`` seconds later. ``preemption_handler()`` returns a
``tf.distribute.experimental.PreemptionCheckpointHandler`` that watches for that SIGTERM: the workers agree
on a step, every worker saves the checkpoint there (the chief into ``checkpoint_dir()``, which the next
attempt gets back), writes the metrics reported so far and exits with
``PREEMPTED_AND_SAVED_EXIT_CODE`` (42), which the coordinator records as "preempted and saved". The next
attempt builds the handler again, which restores that checkpoint. ``backup_and_restore()`` does the same
for ``model.fit`` through tf-keras' ``BackupAndRestore``.

TensorFlow's handler asks the GCE metadata server whether it runs on Google Cloud (an HTTP request with a
5 s timeout, made whatever TerminationConfig it is given), and tf-keras' callback asks again before it
turns ``save_before_preemption`` on (only on Google Cloud). Neither question makes sense under mwms and both
cost 5 s off Google Cloud, so the handler is built with the platform taken from the local devices alone
(``_platform_without_probe``) and the callback creates its handler itself. Nothing is installed when this
module is imported: the SIGTERM handler belongs to the PreemptionCheckpointHandler, created when a program
asks for one, so a program that handles SIGTERM itself, or not at all, is left alone.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

from mwms import task_environment
from mwms_runtime import reporting, writer
from mwms_runtime.env import checkpoint_dir, float_env
from mwms_runtime.strategy_factory import current_strategy

# Where a PreemptionCheckpointHandler given a tf.train.Checkpoint keeps its checkpoints, under
# checkpoint_dir(): TensorFlow puts a non-chief worker's copy in a sibling "workertemp_<i>" folder of this
# one, which must stay inside the task's own checkpoint directory.
PREEMPTION_SUBDIR = "preemption"
BACKUP_SUBDIR = "backup"
# Of the grace, what the final checkpoint, the last metrics and the exit are given when the handler keeps
# training through the grace (train_through_grace=True).
EXIT_RESERVE_S = 10.0

_probe_lock = threading.Lock()


def grace_seconds() -> float:
    """Seconds between the agent's SIGTERM and its SIGKILL (MWMS_PREEMPTION_GRACE_S); 0 when not set."""
    value = float_env(task_environment.PREEMPTION_GRACE_S)
    return max(value, 0.0) if value is not None else 0.0


def exit_preempted() -> None:
    """Write every reported metric and exit with PREEMPTED_AND_SAVED_EXIT_CODE (the handler's exit_fn).

    The handler calls it on every worker after they saved at the same step, so the pending report()
    batch is the same everywhere and its last collective is safe; it waits at most the report timeout,
    and no longer than the grace, for the other workers.
    """
    grace = grace_seconds()
    timeout = min(reporting.report_timeout_seconds(), grace) if grace > 0 else None
    try:
        reporting.flush_reports(timeout, exit_code=task_environment.PREEMPTED_AND_SAVED_EXIT_CODE)
    except Exception as exc:  # noqa: BLE001 - the checkpoint is saved: exit as preempted all the same
        print(f"mwms_runtime: preempted; the last report() values were not written: {exc}", file=sys.stderr)
    writer.flush(timeout if timeout is not None else 30.0)
    print(
        "mwms_runtime: preempted: checkpoint saved, exiting with code "
        f"{task_environment.PREEMPTED_AND_SAVED_EXIT_CODE}",
        file=sys.stderr,
        flush=True,
    )
    sys.exit(task_environment.PREEMPTED_AND_SAVED_EXIT_CODE)


def termination_config(train_through_grace: bool = False) -> Any:
    """The TerminationConfig for the agent: SIGTERM, exit_preempted, and the grace when asked to use it.

    By default the handler saves at the step after the signal and exits at once (TensorFlow's advice for
    a short grace, and it frees the machines soonest). With ``train_through_grace`` it saves there, keeps
    training and saves again shortly before the grace ends, keeping EXIT_RESERVE_S for the last save and exit.
    """
    import tensorflow as tf

    grace = grace_seconds()
    grace_period = max(grace - EXIT_RESERVE_S, 0.0) if train_through_grace else 0.0
    # termination_watcher_fn=None: TensorFlow installs its SIGTERM handler, the agent's signal.
    return tf.distribute.experimental.TerminationConfig(
        termination_watcher_fn=None, exit_fn=exit_preempted, grace_period=grace_period
    )


def _platform_without_probe() -> Any:
    """failure_handling_util.detect_platform() without its GCE metadata request: never Google Cloud."""
    from tensorflow.python.distribute.failure_handling import failure_handling_util as util
    from tensorflow.python.eager import context as eager_context

    devices = eager_context.context()
    if devices.list_logical_devices("GPU"):
        return util.PlatformDevice.INTERNAL_GPU
    if devices.list_logical_devices("TPU"):
        return util.PlatformDevice.INTERNAL_TPU
    return util.PlatformDevice.INTERNAL_CPU


@contextlib.contextmanager
def _no_gce_probe() -> Iterator[None]:
    # PreemptionCheckpointHandler.__init__ calls failure_handling_util.detect_platform() unconditionally
    # (no argument avoids it); swapping that module attribute for the handler's construction is the one
    # way to skip the request.
    from tensorflow.python.distribute.failure_handling import failure_handling_util as util

    with _probe_lock:
        original = util.detect_platform
        util.detect_platform = _platform_without_probe
        try:
            yield
        finally:
            util.detect_platform = original


def _strategy_or_current(strategy: Any) -> Any:
    if strategy is not None:
        return strategy
    strategy = current_strategy()
    if strategy is None:
        import tensorflow as tf

        if tf.distribute.has_strategy():
            return tf.distribute.get_strategy()
        raise RuntimeError(
            "call mwms_runtime.strategy() (and create the model under strategy.scope()) before "
            "mwms_runtime.preemption_handler()"
        )
    return strategy


def _build(cluster_resolver: Any, checkpoint_or_manager: Any, directory: str | None, config: Any) -> Any:
    import tensorflow as tf

    with _no_gce_probe():
        return tf.distribute.experimental.PreemptionCheckpointHandler(
            cluster_resolver, checkpoint_or_manager, checkpoint_dir=directory, termination_config=config
        )


def preemption_handler(
    checkpoint_or_manager: Any,
    strategy: Any = None,
    *,
    directory: str | None = None,
    train_through_grace: bool = False,
) -> Any:
    """Return a PreemptionCheckpointHandler that saves on the agent's SIGTERM and exits with code 42.

    Building it restores the latest checkpoint it saved, so build it once the model, optimizer and step
    variable exist, and read the step afterwards. With a ``tf.train.Checkpoint`` its checkpoints live in
    ``directory`` (default ``checkpoint_dir()/preemption``). With a ``tf.train.CheckpointManager`` (one
    series for periodic and preemption saves; on non-chief workers made on a ``write_path``) every worker
    restores from ``directory``, default the chief's ``checkpoint_dir()``, so all resume at the same step.
    Call ``handler.save_checkpoint_if_preempted()`` after each step's ``report()`` (or run the step with
    ``handler.run``), on every worker.
    """
    import tensorflow as tf

    strategy = _strategy_or_current(strategy)
    resolver = strategy.cluster_resolver
    config = termination_config(train_through_grace)
    if not isinstance(checkpoint_or_manager, tf.train.CheckpointManager):
        path = directory or os.path.join(checkpoint_dir(), PREEMPTION_SUBDIR)
        return _build(resolver, checkpoint_or_manager, path, config)
    handler = _build(resolver, checkpoint_or_manager, None, config)
    if handler._is_chief:
        return handler
    # TensorFlow restores from the manager's own directory, which on a non-chief worker is a temporary
    # write_path, so that worker would not resume. Restore it from the chief's directory and count runs
    # from there (the workers must agree on the run count to agree on the step to save at).
    read = tf.train.CheckpointManager(
        checkpoint_or_manager.checkpoint, directory or checkpoint_dir(), max_to_keep=None
    )
    read.restore_or_initialize()
    handler._read_checkpoint_manager = read
    handler._run_counter = int(handler._checkpointed_runs.numpy())
    return handler


def backup_and_restore(**kwargs: Any) -> Any:
    """Return a tf.keras BackupAndRestore callback for model.fit that saves and exits 42 on SIGTERM.

    ``backup_dir`` defaults to ``checkpoint_dir()/backup`` and ``save_before_preemption`` to True (on the
    agent's SIGTERM every worker saves at the same batch and exits with code 42; the next attempt resumes
    at the batch after it); other arguments (``save_freq``, ``delete_checkpoint``) are BackupAndRestore's.
    """
    from mwms_runtime.keras_backup import PreemptibleBackupAndRestore

    kwargs.setdefault("backup_dir", os.path.join(checkpoint_dir(), BACKUP_SUBDIR))
    return PreemptibleBackupAndRestore(**kwargs)

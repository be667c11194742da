"""PreemptibleBackupAndRestore: tf-keras' BackupAndRestore with save_before_preemption working under mwms.

tf-keras turns ``save_before_preemption`` on only where its GCE metadata request answers (Google Cloud),
and builds its PreemptionCheckpointHandler with no TerminationConfig, which probes again and exits with
an exit code of its own choosing. This subclass keeps the base class' periodic backups and its resume
logic, asks the base class for neither, and in ``on_train_begin`` attaches a handler built by
``mwms_runtime.preemption`` (SIGTERM, no probe, metrics flushed, exit code 42) where tf-keras attaches its
own. It uses the attributes tf-keras itself uses for that (``_training_state.preemption_handler``,
``model._preemption_handler``); a tf-keras that renames them fails the preemption tests.
"""

from __future__ import annotations

import signal
from typing import Any

import tensorflow as tf

from mwms_runtime import preemption


class PreemptibleBackupAndRestore(tf.keras.callbacks.BackupAndRestore):
    """BackupAndRestore whose ``save_before_preemption`` (default True) reacts to the agent's SIGTERM.

    Put it last in ``callbacks``: on a preemption it saves and exits in its ``on_train_batch_end``, so
    callbacks after it do not see that batch end.
    """

    def __init__(self, backup_dir: str, save_before_preemption: bool = True, **kwargs: Any) -> None:
        # The base class only checks and stores the flag here; passing it on would make on_train_begin
        # probe GCE. It is kept here and acted on below.
        super().__init__(backup_dir, save_before_preemption=save_before_preemption, **kwargs)
        self.save_before_preemption = False
        self._mwms_save_before_preemption = save_before_preemption

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Restore as BackupAndRestore does, then attach the preemption handler to its checkpoints."""
        super().on_train_begin(logs)
        if not self._mwms_save_before_preemption:
            return
        state = self._training_state
        strategy = self.model.distribute_strategy
        self._previous_sigterm = signal.getsignal(signal.SIGTERM)
        handler = preemption._build(
            strategy.cluster_resolver, state.write_checkpoint_manager, None, preemption.termination_config()
        )
        # As tf-keras does: every worker reads the chief's backups. The handler restored from the write
        # manager (a non-chief worker's own folder), so restore again from the chief's and count runs
        # (batches) from there: every worker must hold the same count to agree on the batch to save at.
        handler._read_checkpoint_manager = state.read_checkpoint_manager
        state.read_checkpoint_manager.restore_or_initialize()
        handler._run_counter = int(handler._checkpointed_runs.numpy())
        state.preemption_handler = handler
        state._enable_save_before_preemption = True
        self.model._preemption_handler = handler

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        """Drop the handler and give SIGTERM back to what handled it before fit: nothing saves on it now."""
        if getattr(self.model, "_preemption_handler", None) is not None:
            self.model._preemption_handler = None
            signal.signal(signal.SIGTERM, self._previous_sigterm)
        super().on_train_end(logs)

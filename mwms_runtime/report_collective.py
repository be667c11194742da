"""The all-reduce behind report(): its timeout and watchdog, and how a worker stops when the workers disagree.

``all_reduce_sum`` SUMs the packed vectors of a batch across every replica of every worker within the report
timeout. A collective that waits longer than that, or workers that packed different calls, end the process
through ``abort`` (exit code 70, or ``abort_exit_code`` while a preempted task reduces its last batch); any
other collective failure (a peer crashed) is re-raised.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from typing import Any

import numpy as np

from mwms import task_environment
from mwms_runtime import save_paths, writer
from mwms_runtime.env import context, float_env
from mwms_runtime.report_packing import Entry

DEFAULT_REPORT_TIMEOUT_S = 120.0
EXIT_REPORT_MISMATCH = 70
WATCHDOG_GRACE_S = 5.0


def report_timeout_seconds() -> float:
    """Seconds one report() waits for the other workers: MWMS_REPORT_TIMEOUT_S, MWMS_COLLECTIVE_TIMEOUT_S or 120."""
    for name in (task_environment.REPORT_TIMEOUT_S, task_environment.COLLECTIVE_TIMEOUT_S):
        value = float_env(name)
        if value is not None and value > 0:
            return value
    return DEFAULT_REPORT_TIMEOUT_S


# What abort exits with: 70, but 42 while a preempted task reduces its last batch (its checkpoint is
# saved whatever happens to those values). reporting.flush_reports sets it.
abort_exit_code = EXIT_REPORT_MISMATCH


# A worker that stops on a mismatch read it from a collective's result, which its peers may still be
# receiving from it (a ring's last transfers): it lingers this long before it exits, so that they finish
# that collective, read the same mismatch and stop with the same code, not with a "Socket closed".
ABORT_LINGER_S = 3.0


def abort(message: str, linger: bool = True) -> None:
    """Print ``message``, write what was reported so far and end the process with exit code 70 (after
    ABORT_LINGER_S when other workers may still be receiving the collective that told it to stop)."""
    print(message, file=sys.stderr, flush=True)
    writer.flush(timeout=5.0)
    save_paths.cleanup_all()  # os._exit skips atexit
    if linger and context().num_workers > 1:
        time.sleep(ABORT_LINGER_S)
    os._exit(abort_exit_code)


def abort_timeout(step: int, seconds: float, detail: str) -> None:
    abort(
        f"mwms_runtime.report() at step {step} waited {seconds:g} s for the other workers: every worker "
        f"must call report() at the same steps (with the same metric names). {detail}".rstrip(),
        linger=False,  # a peer that never came receives nothing
    )


def first_line(exc: Exception) -> str:
    # Drop TF's "{{function_node ...}}" prefix: the rest says what happened.
    text = re.sub(r"\{\{.*?\}\}", "", str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def mismatch_message(step: int, ops: dict[str, str], num_workers: int) -> str:
    names = ", ".join(f"{name} ({ops[name]})" for name in sorted(ops))
    return (
        f"mwms_runtime.report() at step {step}: the {num_workers} workers did not all report this step "
        f"with the same metric names and ops (this worker reported {names}). Every worker must call "
        "report() at the same steps with the same metric names and reduce ops."
    )


def all_reduce_sum(
    strategy: Any, packed: list[np.ndarray], first: Entry, num_workers: int, timeout: float
) -> np.ndarray:
    """SUM the per-local-replica vectors across every replica of every worker, within ``timeout`` s."""
    import tensorflow as tf

    if not tf.executing_eagerly():
        raise RuntimeError("mwms_runtime.report() must be called from Python, not inside a tf.function")
    devices = strategy.extended.worker_devices
    step, ops = first.step, first.ops

    def value_fn(value_context):
        local = value_context.replica_id_in_sync_group % len(devices)
        with tf.device(devices[local]):
            return tf.constant(packed[local])

    per_replica = strategy.experimental_distribute_values_from_function(value_fn)
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)
    watchdog = threading.Timer(timeout + WATCHDOG_GRACE_S, abort_timeout, args=(step, timeout, "(watchdog)"))
    watchdog.daemon = True
    started = time.monotonic()
    watchdog.start()
    try:
        reduced = strategy.extended.reduce_to(
            tf.distribute.ReduceOp.SUM, per_replica, destinations="/device:CPU:0", options=options
        )
        return strategy.experimental_local_results(reduced)[0].numpy()
    except tf.errors.DeadlineExceededError as exc:
        abort_timeout(step, timeout, f"The collective failed with {type(exc).__name__}: {first_line(exc)}")
        raise  # unreachable: abort exits
    except tf.errors.InvalidArgumentError as exc:
        if "Shape mismatch" in str(exc):  # the workers packed different numbers of metrics or calls
            abort(mismatch_message(step, ops, num_workers))
        note_failure(step, started, exc)
        raise
    except tf.errors.OpError as exc:
        # Not a timeout: most often a peer ended. Say where it happened and let the real error surface.
        note_failure(step, started, exc)
        raise
    finally:
        watchdog.cancel()


def note_failure(step: int, started: float, exc: Exception) -> None:
    print(
        f"mwms_runtime.report() at step {step} failed after {time.monotonic() - started:.1f} s: "
        f"{type(exc).__name__}: {first_line(exc)}",
        file=sys.stderr,
        flush=True,
    )

"""report(): reduce metrics across every replica of every worker, a batch of calls per collective, then write them.

Each value is turned into a per-replica (sum, count) pair, so one SUM all-reduce of a packed vector serves
every metric of a call: SUM is the total of the sums, MEAN is total sum / total count.

- python numbers, numpy values, plain tensors and Mirrored values are this worker's value (count 1 per
  element, on the worker's first replica): MEAN averages workers, SUM adds them.
- PerReplica values (from ``strategy.run``) contribute each local replica's component.
- A non-scalar value is treated as per-example values: every element counts, like
  ``strategy.reduce(op, value, axis=0)`` (MEAN divides by the total number of elements, so a short last
  batch gets the right denominator).

Values already identical on every worker skip all of this: a ``ReducedMetrics`` (from ``reduce_metrics``
inside the training step, which reduces every metric in one in-graph collective) or a dict passed with
``reduced=True`` (results of ``strategy.reduce``, fit's logs) is converted and written by the chief, with
no collective, so workers that differ in whether they call it cannot hang each other.

Otherwise report() is a collective: every worker must call it at the same steps with the same metric names and
ops. One all-reduce per call would cost about as much as the training step itself (a second collective
per step), so calls are batched: each worker packs its values and keeps them, and one all-reduce reduces
the batch. A batch ends at a call whose names and ops were not reported before (so a new metric is checked
at once), at ``report(..., wait=True)``, at ``flush()``, at exit, at a preemption (mwms_runtime.preemption)
and when it holds ``limit`` calls. The limit is the same on every worker, since collectives must line up:
it starts at 1, at most doubles after each batch and is cut so that a batch spans about
``MAX_BATCH_DELAY_S`` by the workers' mean time per call, which every worker learns from the same
all-reduce; it never exceeds ``MAX_BATCH_CALLS``. So values reach the metrics file a few steps late.

Each call in the vector carries this worker's step and a fingerprint of (step, names, ops) on its first
replica; a sum that is not num_workers times this worker's own ends the process with exit code 70 and a
message naming the step and names. So does a collective that waits longer than the report timeout for the
other workers, instead of hanging. Any other collective failure (a peer crashed) is re-raised.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
import threading
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mwms import task_environment
from mwms_runtime import save_paths, writer
from mwms_runtime.env import context, float_env
from mwms_runtime.reduced import ReducedMetrics
from mwms_runtime.strategy_factory import current_strategy

DEFAULT_REPORT_TIMEOUT_S = 120.0
EXIT_REPORT_MISMATCH = 70
_WATCHDOG_GRACE_S = 5.0
# A batch of report() calls spans about this many seconds (by the workers' mean time per call) ...
MAX_BATCH_DELAY_S = 1.0
# ... and holds at most this many calls, so values reach the metrics file at most this many steps late.
MAX_BATCH_CALLS = 64
# How long the exit path waits for the other workers to reduce the last batch.
EXIT_FLUSH_TIMEOUT_S = 30.0
_OPS = ("MEAN", "SUM")


def report_timeout_seconds() -> float:
    """Seconds one report() waits for the other workers: MWMS_REPORT_TIMEOUT_S, MWMS_COLLECTIVE_TIMEOUT_S or 120."""
    for name in (task_environment.REPORT_TIMEOUT_S, task_environment.COLLECTIVE_TIMEOUT_S):
        value = float_env(name)
        if value is not None and value > 0:
            return value
    return DEFAULT_REPORT_TIMEOUT_S


def _op_name(op: Any) -> str:
    name = getattr(op, "name", op)
    name = str(name).upper()
    if name not in _OPS:
        raise ValueError(f"reduce op must be 'MEAN' or 'SUM', got {op!r}")
    return name


def ops_for(names: list[str], reduce: Any) -> dict[str, str]:
    if isinstance(reduce, Mapping):
        unknown = set(reduce) - set(names)
        if unknown:
            raise ValueError(f"reduce names metrics that were not reported: {sorted(unknown)}")
        return {n: _op_name(reduce.get(n, "MEAN")) for n in names}
    op = _op_name(reduce)
    return {n: op for n in names}


def _is_plain(value: Any) -> bool:
    return isinstance(value, (int, float, np.number, np.ndarray)) and not isinstance(value, bool)


def _sum_count(value: Any) -> tuple[float, float]:
    array = np.asarray(value.numpy() if hasattr(value, "numpy") else value, dtype=np.float64)
    return float(array.sum()), float(array.size)


def _local_components(value: Any, strategy: Any, num_local: int) -> list[tuple[float, float]]:
    """Return one (sum, count) per local replica for one metric value."""
    if strategy is not None and not _is_plain(value):
        import tensorflow as tf
        from tensorflow.python.distribute import values as distribute_values

        if isinstance(value, tf.distribute.DistributedValues) and not isinstance(
            value, distribute_values.Mirrored
        ):
            parts = [_sum_count(v) for v in strategy.experimental_local_results(value)]
            if len(parts) != num_local:
                raise ValueError(f"expected {num_local} local replica values, got {len(parts)}")
            return parts
        if isinstance(value, distribute_values.Mirrored):
            value = strategy.experimental_local_results(value)[0]
    return [_sum_count(value)] + [(0.0, 0.0)] * (num_local - 1)


# What _abort exits with: 70, but 42 while a preempted task reduces its last batch (its checkpoint is
# saved whatever happens to those values).
_abort_exit_code = EXIT_REPORT_MISMATCH


# A worker that stops on a mismatch read it from a collective's result, which its peers may still be
# receiving from it (a ring's last transfers): it lingers this long before it exits, so that they finish
# that collective, read the same mismatch and stop with the same code, not with a "Socket closed".
ABORT_LINGER_S = 3.0


def _abort(message: str, linger: bool = True) -> None:
    """Print ``message``, write what was reported so far and end the process with exit code 70 (after
    ABORT_LINGER_S when other workers may still be receiving the collective that told it to stop)."""
    print(message, file=sys.stderr, flush=True)
    writer.flush(timeout=5.0)
    save_paths.cleanup_all()  # os._exit skips atexit
    if linger and context().num_workers > 1:
        time.sleep(ABORT_LINGER_S)
    os._exit(_abort_exit_code)


def _abort_timeout(step: int, seconds: float, detail: str) -> None:
    _abort(
        f"mwms_runtime.report() at step {step} waited {seconds:g} s for the other workers: every worker "
        f"must call report() at the same steps (with the same metric names). {detail}".rstrip(),
        linger=False,  # a peer that never came receives nothing
    )


def _first_line(exc: Exception) -> str:
    # Drop TF's "{{function_node ...}}" prefix: the rest says what happened.
    text = re.sub(r"\{\{.*?\}\}", "", str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _mismatch_message(step: int, ops: dict[str, str], num_workers: int) -> str:
    names = ", ".join(f"{name} ({ops[name]})" for name in sorted(ops))
    return (
        f"mwms_runtime.report() at step {step}: the {num_workers} workers did not all report this step "
        f"with the same metric names and ops (this worker reported {names}). Every worker must call "
        "report() at the same steps with the same metric names and reduce ops."
    )


def _all_reduce_sum(
    strategy: Any, packed: list[np.ndarray], first: _Entry, num_workers: int, timeout: float
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
    watchdog = threading.Timer(
        timeout + _WATCHDOG_GRACE_S, _abort_timeout, args=(step, timeout, "(watchdog)")
    )
    watchdog.daemon = True
    started = time.monotonic()
    watchdog.start()
    try:
        reduced = strategy.extended.reduce_to(
            tf.distribute.ReduceOp.SUM, per_replica, destinations="/device:CPU:0", options=options
        )
        return strategy.experimental_local_results(reduced)[0].numpy()
    except tf.errors.DeadlineExceededError as exc:
        _abort_timeout(step, timeout, f"The collective failed with {type(exc).__name__}: {_first_line(exc)}")
        raise  # unreachable: _abort exits
    except tf.errors.InvalidArgumentError as exc:
        if "Shape mismatch" in str(exc):  # the workers packed different numbers of metrics or calls
            _abort(_mismatch_message(step, ops, num_workers))
        _note_failure(step, started, exc)
        raise
    except tf.errors.OpError as exc:
        # Not a timeout: most often a peer ended. Say where it happened and let the real error surface.
        _note_failure(step, started, exc)
        raise
    finally:
        watchdog.cancel()


def _note_failure(step: int, started: float, exc: Exception) -> None:
    print(
        f"mwms_runtime.report() at step {step} failed after {time.monotonic() - started:.1f} s: "
        f"{type(exc).__name__}: {_first_line(exc)}",
        file=sys.stderr,
        flush=True,
    )


def _fingerprint(step: int, ops: dict[str, str]) -> float:
    """24-bit CRC of the step, names and ops: exact in float64 even when summed over many workers."""
    text = f"{step}|" + ",".join(f"{name}:{ops[name]}" for name in sorted(ops))
    return float(zlib.crc32(text.encode("utf-8")) & 0xFFFFFF)


def names_fingerprint(ops: dict[str, str]) -> float:
    """24-bit CRC of the names and ops alone (reduce_metrics does not know the step when it is traced)."""
    text = "reduced|" + ",".join(f"{name}:{ops[name]}" for name in sorted(ops))
    return float(zlib.crc32(text.encode("utf-8")) & 0xFFFFFF)


@dataclass
class _Entry:
    """One report() call, packed: per local replica, the sums, the counts, then (step, fingerprint)."""

    step: int
    names: list[str]
    ops: dict[str, str]
    packed: list[np.ndarray]

    @property
    def signature(self) -> tuple[tuple[str, str], ...]:
        return tuple((name, self.ops[name]) for name in self.names)

    def values(self, total: np.ndarray) -> dict[str, float]:
        """The reduced values from this entry's slice of the summed vector."""
        count = len(self.names)
        sums, counts = total[:count], total[count : 2 * count]
        result = {}
        for i, name in enumerate(self.names):
            if self.ops[name] == "SUM":
                result[name] = float(sums[i])
            else:
                result[name] = float(sums[i] / counts[i]) if counts[i] else float("nan")
        return result


def _shape() -> tuple[Any, int, int]:
    """(strategy or None, local replicas, workers) of this process."""
    strategy = current_strategy()
    if strategy is None and "tensorflow" in sys.modules:
        import tensorflow as tf

        if tf.distribute.has_strategy():
            strategy = tf.distribute.get_strategy()
    if strategy is None:
        if context().num_workers > 1:
            raise RuntimeError(
                "call mwms_runtime.strategy() before mwms_runtime.report() in a multi-worker job"
            )
        return None, 1, 1
    num_local = len(strategy.extended.worker_devices)
    return strategy, num_local, max(strategy.num_replicas_in_sync // num_local, 1)


def _pack(
    metrics: Mapping[str, Any], ops: dict[str, str], step: int, strategy: Any, num_local: int
) -> _Entry:
    # Sorted so workers that built the dict in a different order still pack the same vector.
    names = sorted(metrics)
    per_metric = [_local_components(metrics[n], strategy, num_local) for n in names]
    # The first replica also carries (step, fingerprint) so the workers can check they agree.
    header = [[float(step), _fingerprint(step, ops)]] + [[0.0, 0.0]] * (num_local - 1)
    packed = [
        np.array(
            [pm[r][0] for pm in per_metric] + [pm[r][1] for pm in per_metric] + header[r], dtype=np.float64
        )
        for r in range(num_local)
    ]
    return _Entry(step=step, names=names, ops=ops, packed=packed)


class ReportedValues(dict):
    """What report() returns: the reduced values of the call at ``step`` (an earlier one inside a batch).

    A dict; reading it (items, indexing, comparing, printing...) tells report() that the program uses its
    results, and the next batch then ends at the next call, so a program that reads them every step gets
    every step's own values.
    """

    def __init__(self, values: dict[str, float], step: int) -> None:
        super().__init__(values)  # a plain dict: copying it is not a read
        self.step = step


def _noting_reads(name: str) -> Any:
    method = getattr(dict, name)

    def read(self: ReportedValues, *args: Any, **kwargs: Any) -> Any:
        _batch.read = True
        return method(self, *args, **kwargs)

    read.__name__ = name
    return read


for _method in (
    "__getitem__",
    "__iter__",
    "__len__",
    "__contains__",
    "__eq__",
    "__ne__",
    "__repr__",
    "__or__",
    "__ror__",
    "get",
    "items",
    "keys",
    "values",
    "copy",
):
    setattr(ReportedValues, _method, _noting_reads(_method))


class _Batch:
    """This worker's report() calls not reduced yet, and the rule (the same on every worker) that ends a batch."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.pending: list[_Entry] = []
        self.strategy: Any = None
        self.num_local = 1
        self.num_workers = 1
        self.limit = 1  # calls per collective, agreed: every worker computes it from the same sums
        self.batches = 0
        self.read = False  # whether the program read a ReportedValues since the last collective
        self.started: float | None = None  # when the previous batch was reduced (or the first call)
        self.seen: set[tuple[tuple[str, str], ...]] = set()
        # Per (names, ops): the step and values of the latest reduced call (plain: reading them is ours).
        self.latest: dict[tuple[tuple[str, str], ...], tuple[int, dict[str, float]]] = {}
        self.exit_hook = False
        self.crashed = False  # an uncaught exception is ending the program

    def add(self, entry: _Entry, wait: bool) -> ReportedValues:
        """Queue ``entry``; reduce the batch when it must end here; return the entry's latest values."""
        with self.lock:
            if self.started is None:
                self.started = time.monotonic()
            self.pending.append(entry)
            if not self.exit_hook:
                self._install_exit_hooks()
            if wait or entry.signature not in self.seen or len(self.pending) >= self.limit:
                self.reduce(report_timeout_seconds())
            step, values = self.latest[entry.signature]
            return ReportedValues(values, step)

    def _install_exit_hooks(self) -> None:
        """Reduce the last batch at exit, unless the program ends with an uncaught exception.

        After an exception the other workers are most likely inside a training collective, not at exit:
        the last batch's all-reduce would wait out its timeout and turn the exit code into 70.
        """
        self.exit_hook = True
        atexit.register(flush_at_exit)
        previous = sys.excepthook

        def note_uncaught(*args: Any) -> None:
            self.crashed = True
            previous(*args)

        sys.excepthook = note_uncaught

    def reduce(self, timeout: float) -> None:
        """One all-reduce for every pending call, then queue their values for the chief's writer."""
        with self.lock:
            batch, self.pending = self.pending, []
            if not batch:
                return
            num_local, num_workers = self.num_local, self.num_workers
            elapsed = time.monotonic() - (self.started or time.monotonic())
            read, self.read = self.read, False
            # Replica 0 also carries (seconds this batch took, whether results were read, calls in it):
            # the next batch's limit is computed from their sums, so it is the same on every worker.
            trailer = [np.array([elapsed, float(read), float(len(batch))])] + [np.zeros(3)] * (num_local - 1)
            packed = [
                np.concatenate([entry.packed[r] for entry in batch] + [trailer[r]]) for r in range(num_local)
            ]
            total = _all_reduce_sum(self.strategy, packed, batch[0], num_workers, timeout)
            if total[-1] != len(batch) * num_workers:
                _abort(_mismatch_message(batch[0].step, batch[0].ops, num_workers))
            offset, now, chief = 0, time.time(), _is_chief()
            for entry in batch:
                size = len(entry.packed[0])
                part = total[offset : offset + size]
                _check_agreement(part[-2:], entry.step, entry.ops, num_workers)
                values = entry.values(part)
                self.latest[entry.signature] = (entry.step, values)
                self.seen.add(entry.signature)
                if chief:
                    writer.get_writer().put(writer.MetricsRecord(step=entry.step, values=values, time=now))
                offset += size
            # Batches grow only once a batch has shown that no worker reads report()'s results (the
            # first batch cannot have): a program that reads them gets each call's own values.
            if self.batches == 0 or total[-2] > 0:
                self.limit = 1
            else:
                self.limit = next_limit(self.limit, total[-3] / num_workers / len(batch))
            self.batches += 1
            self.started = time.monotonic()


def next_limit(limit: int, seconds_per_call: float) -> int:
    """Calls in the next batch: at most double, so the batch spans about MAX_BATCH_DELAY_S, 1..MAX_BATCH_CALLS."""
    by_time = int(MAX_BATCH_DELAY_S / seconds_per_call) if seconds_per_call > 0 else MAX_BATCH_CALLS
    return max(1, min(2 * limit, by_time, MAX_BATCH_CALLS))


_batch = _Batch()


def _check_agreement(header: np.ndarray, step: int, ops: dict[str, str], num_workers: int) -> None:
    """Abort unless every worker packed the same step and fingerprint (the sums are num_workers x own)."""
    expected = np.array([step, _fingerprint(step, ops)], dtype=np.float64) * num_workers
    if not np.array_equal(header, expected):
        _abort(_mismatch_message(step, ops, num_workers))


def _reduce_now(entry: _Entry) -> dict[str, float]:
    """Reduce a call of a process that is the only worker: every replica is local, no collective."""
    total = np.sum(entry.packed, axis=0)
    values = entry.values(total)
    if _is_chief():
        writer.get_writer().put(writer.MetricsRecord(step=entry.step, values=values, time=time.time()))
    return values


def flush_reports(timeout: float | None = None, exit_code: int = EXIT_REPORT_MISMATCH) -> None:
    """Reduce the pending report() calls now: a collective, so every worker must call it at the same point.

    Waits at most ``timeout`` seconds (default the report timeout) for the other workers, then ends the
    process with ``exit_code`` (70) as report() does. Nothing happens when no call is pending.
    """
    global _abort_exit_code
    seconds = (
        report_timeout_seconds() if timeout is None else max(min(timeout, report_timeout_seconds()), 1.0)
    )
    with _batch.lock:
        _abort_exit_code = exit_code
        try:
            _batch.reduce(seconds)
        finally:
            _abort_exit_code = EXIT_REPORT_MISMATCH


def flush_at_exit() -> None:
    """At interpreter exit: reduce what is pending (every worker is ending too) and write it; never raise."""
    if _batch.crashed and _batch.pending:
        steps = f"{_batch.pending[0].step}-{_batch.pending[-1].step}"
        print(
            f"mwms_runtime: report() values of steps {steps} not written: the program failed", file=sys.stderr
        )
        _batch.pending = []
    try:
        flush_reports(EXIT_FLUSH_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - a peer that already failed must not turn an exit into a traceback
        print(f"mwms_runtime: the last report() values were not written: {_first_line(exc)}", file=sys.stderr)
    writer.flush(EXIT_FLUSH_TIMEOUT_S)


def flush(timeout: float | None = 60.0) -> bool:
    """Reduce the pending report() calls, wait until every metric is written; False if the timeout ran out.

    report() reduces its calls in batches, so this is a collective while some are pending: call it on
    every worker.
    """
    flush_reports(timeout)
    return writer.flush(timeout)


_chief_by_env: dict[tuple[str | None, str | None], bool] = {}


def _is_chief() -> bool:
    """context().is_chief, remembered per (MWMS_TASK_INDEX, TF_CONFIG): report() may run every step."""
    key = (os.environ.get(task_environment.TASK_INDEX), os.environ.get(task_environment.TF_CONFIG))
    chief = _chief_by_env.get(key)
    if chief is None:
        chief = _chief_by_env[key] = context().is_chief
    return chief


def _identical_scalar(name: str, value: Any) -> float:
    """A value the caller says is already the same on every worker, as a float (no collective)."""
    if not _is_plain(value) and "tensorflow" in sys.modules:
        import tensorflow as tf
        from tensorflow.python.distribute import values as distribute_values

        if isinstance(value, distribute_values.Mirrored):
            value = value._values[0]
        elif isinstance(value, tf.distribute.DistributedValues):
            raise ValueError(
                f"report(..., reduced=True) got a per-replica value for {name!r}: it differs between "
                "replicas, so report it without reduced=True (report() then reduces it), or reduce it "
                "first (strategy.reduce, mwms_runtime.reduce_metrics)"
            )
    array = np.asarray(value.numpy() if hasattr(value, "numpy") else value, dtype=np.float64)
    if array.size != 1:
        raise ValueError(
            f"report(..., reduced=True) got {array.size} values for {name!r}: a reduced metric is one number"
        )
    return float(array.reshape(()))


def _report_reduced(step: int, metrics: Mapping[str, Any], agreed: Any = True) -> dict[str, float]:
    """Write values that are already identical on every worker: the chief queues them, nobody reduces."""
    if not bool(np.asarray(agreed.numpy() if hasattr(agreed, "numpy") else agreed)):
        names = ", ".join(sorted(metrics))
        _abort(
            f"mwms_runtime.report() at step {step}: the workers did not all reduce the same metric names "
            f"and ops in reduce_metrics() (this worker reduced {names}). Every worker must call "
            "reduce_metrics() in the same steps with the same metric names and reduce ops."
        )
    values = {name: _identical_scalar(name, metrics[name]) for name in sorted(metrics)}
    if _is_chief():
        writer.get_writer().put(writer.MetricsRecord(step=step, values=values, time=time.time()))
    return values


def report(
    step: int,
    metrics: Mapping[str, Any] | ReducedMetrics,
    reduce: Any = "MEAN",
    reduced: bool = False,
    wait: bool = False,
) -> dict[str, float]:
    """Reduce ``metrics`` across all workers (a collective, batched) and, on the chief, queue them for writing.

    Returns the reduced values of the latest reduced call with these names and ops: this call's when it
    ended a batch (its first call, ``wait=True``, or a full batch), else an earlier step's. With
    ``wait=True`` (on every worker at the same call) the batch ends here and this call's values are
    returned. Values that are already identical on every worker need no collective: a ``ReducedMetrics``
    from ``reduce_metrics()``, or a dict passed with ``reduced=True`` (results of ``strategy.reduce``,
    fit's logs). Then only the chief writes them and ``reduce`` is not used; no worker waits for another.
    """
    if isinstance(metrics, ReducedMetrics):
        return _report_reduced(int(step), metrics.values, metrics.agreed) if metrics.values else {}
    if not metrics:
        return {}
    step = int(step)
    if reduced:
        return _report_reduced(step, metrics)
    ops = ops_for(list(metrics), reduce)
    strategy, num_local, num_workers = _shape()
    entry = _pack(metrics, ops, step, strategy, num_local)
    if num_workers == 1:
        return ReportedValues(_reduce_now(entry), step)
    with _batch.lock:
        _batch.strategy, _batch.num_local, _batch.num_workers = strategy, num_local, num_workers
        return _batch.add(entry, wait)

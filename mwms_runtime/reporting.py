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

This module holds report() and its batching (the pending calls, the agreed batch limit, flush); how a call
is packed into vectors is mwms_runtime.report_packing's, the all-reduce and the exits on a mismatch or a
timeout are mwms_runtime.report_collective's.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from mwms import task_environment
from mwms_runtime import report_collective, writer
from mwms_runtime.env import context
from mwms_runtime.reduced import ReducedMetrics
from mwms_runtime.report_collective import EXIT_REPORT_MISMATCH as EXIT_REPORT_MISMATCH
from mwms_runtime.report_collective import abort as _abort
from mwms_runtime.report_collective import all_reduce_sum as _all_reduce_sum
from mwms_runtime.report_collective import first_line as _first_line
from mwms_runtime.report_collective import mismatch_message as _mismatch_message
from mwms_runtime.report_collective import report_timeout_seconds as report_timeout_seconds
from mwms_runtime.report_packing import Entry as _Entry
from mwms_runtime.report_packing import fingerprint as _fingerprint
from mwms_runtime.report_packing import identical_scalar as _identical_scalar
from mwms_runtime.report_packing import names_fingerprint as names_fingerprint
from mwms_runtime.report_packing import ops_for as ops_for
from mwms_runtime.report_packing import pack as _pack
from mwms_runtime.report_packing import shape as _shape

# A batch of report() calls spans about this many seconds (by the workers' mean time per call) ...
MAX_BATCH_DELAY_S = 1.0
# ... and holds at most this many calls, so values reach the metrics file at most this many steps late.
MAX_BATCH_CALLS = 64
# How long the exit path waits for the other workers to reduce the last batch.
EXIT_FLUSH_TIMEOUT_S = 30.0


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
    seconds = (
        report_timeout_seconds() if timeout is None else max(min(timeout, report_timeout_seconds()), 1.0)
    )
    with _batch.lock:
        report_collective.abort_exit_code = exit_code
        try:
            _batch.reduce(seconds)
        finally:
            report_collective.abort_exit_code = EXIT_REPORT_MISMATCH


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

"""Append reported metrics to the metrics file and TensorBoard event files from a background thread.

The training thread only enqueues; a daemon thread does all file I/O. The metrics file is the agent's
contract: one complete line per point in the format of ``mwms.metrics_line`` (non-finite values as
"NaN"/"Infinity"/"-Infinity"), appended and flushed, never rewritten or truncated. Records are written in
batches (at most ``BATCH_INTERVAL_S`` late, at once on ``flush()``) so that reporting every step does not
wake the thread every step.
TensorBoard events are written as a TFRecord file of ``Event`` protos (public TF API, no graph ops).
"""

from __future__ import annotations

import atexit
import os
import queue
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from mwms import metrics_line
from mwms_runtime.env import context

# How long the thread collects records before writing them: metrics reach the file at most this late.
BATCH_INTERVAL_S = 0.1


@dataclass(frozen=True)
class MetricsRecord:
    """Reduced values of one report() call."""

    step: int
    values: dict[str, float]
    time: float


class MetricsWriter:
    """Owns the daemon thread that appends records to the metrics file and TensorBoard."""

    def __init__(self, metrics_file: str, tensorboard_dir: str | None) -> None:
        self.metrics_file = metrics_file
        self.tensorboard_dir = tensorboard_dir
        self._queue: queue.Queue[MetricsRecord] = queue.Queue()
        self._events: Any = None
        self._warned: set[str] = set()
        # Opened here so a file that cannot be opened is an error in the training thread, not a writer
        # thread that dies and leaves every flush() waiting out its timeout.
        try:
            os.makedirs(os.path.dirname(os.path.abspath(metrics_file)), exist_ok=True)
            self._out = open(metrics_file, "a", encoding="utf-8")  # noqa: SIM115 - the thread owns it
        except OSError as exc:
            raise RuntimeError(
                f"mwms_runtime cannot open the metrics file {metrics_file} ({exc}); "
                "check MWMS_METRICS_FILE / MWMS_OUTPUT_DIR and that the directory is writable"
            ) from exc
        # Set by flush() so the thread writes at once instead of finishing its batching interval.
        self._flush_now = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mwms-metrics-writer", daemon=True)
        self._thread.start()

    def put(self, record: MetricsRecord) -> None:
        """Enqueue a record; never blocks on I/O."""
        self._queue.put(record)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every enqueued record is written; return False if the timeout ran out first."""
        self._flush_now.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._queue.all_tasks_done.wait(remaining)
        return True

    def _run(self) -> None:
        with self._out as out:
            while True:
                batch = [self._queue.get()]
                # Records of a step-by-step report() arrive every few milliseconds: waking for each one
                # would take the GIL and a core from the training thread every step. Collect for a
                # moment and write them together (one write and flush per file per batch).
                self._flush_now.wait(BATCH_INTERVAL_S)
                self._flush_now.clear()
                while True:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                try:
                    self._write_batch(out, batch)
                finally:
                    for _ in batch:
                        self._queue.task_done()

    def _write_batch(self, out, batch: list[MetricsRecord]) -> None:
        lines = []
        for record in batch:
            lines.extend(self._lines(record))
        try:
            out.write("".join(lines))
            out.flush()
        except Exception as exc:  # noqa: BLE001 - a failed write must not kill training
            self._warn("write", f"could not write metrics at step {batch[0].step}: {exc}")
        try:
            self._write_events(batch)
        except Exception as exc:  # noqa: BLE001
            self._warn("events", f"could not write TensorBoard events at step {batch[0].step}: {exc}")

    def _lines(self, record: MetricsRecord) -> list[str]:
        lines = []
        for name, value in record.values.items():
            try:
                lines.append(metrics_line.encode(name, record.step, value, record.time))
            except metrics_line.InvalidMetricLine as problem:
                self._warn(
                    f"name:{name[:60]}", f"metric {name[:60]!r} at step {record.step} not recorded: {problem}"
                )
        return lines

    def _write_events(self, batch: list[MetricsRecord]) -> None:
        if self.tensorboard_dir is None:
            return
        import tensorflow as tf

        if self._events is None:
            os.makedirs(self.tensorboard_dir, exist_ok=True)
            name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.mwms"
            self._events = tf.io.TFRecordWriter(os.path.join(self.tensorboard_dir, name))
            header = tf.compat.v1.Event(wall_time=time.time(), file_version="brain.Event:2")
            self._events.write(header.SerializeToString())
        for record in batch:
            summary = tf.compat.v1.Summary(
                value=[tf.compat.v1.Summary.Value(tag=n, simple_value=v) for n, v in record.values.items()]
            )
            event = tf.compat.v1.Event(wall_time=record.time, step=record.step, summary=summary)
            self._events.write(event.SerializeToString())
        self._events.flush()

    def _warn(self, key: str, message: str) -> None:
        """Prints `message` the first time a problem `key` (a failed write, one bad metric name) is seen."""
        if key not in self._warned and len(self._warned) < 100:
            print(f"mwms_runtime: {message}", file=sys.stderr, flush=True)
            self._warned.add(key)


_writer: MetricsWriter | None = None
_writer_lock = threading.Lock()


def get_writer() -> MetricsWriter:
    """Return the process's writer, starting it on first use (chief only)."""
    global _writer
    with _writer_lock:
        if _writer is None:
            ctx = context()
            metrics_file = ctx.metrics_file or os.path.join(ctx.output_dir, "metrics.jsonl")
            _writer = MetricsWriter(metrics_file, os.path.join(ctx.output_dir, "tensorboard"))
            atexit.register(flush, 30.0)
        return _writer


def flush(timeout: float | None = 60.0) -> bool:
    """Wait until every reported metric has been written; return False if the timeout ran out."""
    writer = _writer
    return True if writer is None else writer.flush(timeout)

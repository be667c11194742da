"""Tails a task's metrics file (lines in the mwms.metrics_line format, written by mwms_runtime) into MetricPoints.

The seq of a point is its line number (1-based), so it is the same however often the agent reconnects.
Only complete lines are consumed; a line still being written is read on a later poll.
"""

from __future__ import annotations

from pathlib import Path

from mwms import metrics_line
from mwms.v1 import agent_pb2
from mwms.worker_agent.task_files import read_beneath

# Read at most this much per poll, so one huge file cannot stall the task's other work.
MAX_READ_BYTES = 4 * 1024 * 1024


class MetricsTail:
    """Remembers how far `path` has been read; `poll()` returns the points of newly completed lines."""

    def __init__(self, path: Path, within: Path | None = None) -> None:
        self.path = path
        # The task dir `path` lies in: read without following links the task may have put there.
        self._within = within
        self._refused = False
        self._offset = 0
        self._line_number = 0
        # Inside a line longer than MAX_READ_BYTES, read past up to its newline: no metric is that long.
        self._skipping = False

    def poll(self) -> tuple[list[agent_pb2.MetricPoint], list[str]]:
        """New points, and a warning for every new line that is not a valid metric (its seq is used up)."""
        try:
            if self._within is not None:
                chunk = read_beneath(self._within, self.path, MAX_READ_BYTES, self._offset)
            else:
                with self.path.open("rb") as file:
                    file.seek(self._offset)
                    chunk = file.read(MAX_READ_BYTES)
        except FileNotFoundError:
            return [], []
        except OSError as error:  # a link or a fifo in place of the file: nothing is read from it
            if self._refused:
                return [], []
            self._refused = True
            return [], [f"mwms-agent: the metrics file is not read: {error.strerror or error}"]
        points: list[agent_pb2.MetricPoint] = []
        warnings: list[str] = []
        if self._skipping:
            rest = chunk.find(b"\n") + 1
            self._offset += rest or len(chunk)
            if not rest:
                return [], []
            self._skipping = False
            chunk = chunk[rest:]
        complete_end = chunk.rfind(b"\n") + 1
        if not complete_end and len(chunk) == MAX_READ_BYTES:  # a line it would wait for for ever
            self._line_number += 1
            self._skipping = True
            self._offset += len(chunk)
            warnings.append(
                f"mwms-agent: skipped metrics line {self._line_number} (longer than {MAX_READ_BYTES} bytes)"
            )
            return points, warnings
        for raw in chunk[:complete_end].split(b"\n")[:-1]:
            self._line_number += 1
            if not raw.strip():
                continue
            try:
                points.append(parse_metric_line(raw, self._line_number))
            except ValueError as error:
                text = raw.decode("utf-8", "replace")[:200]
                warnings.append(f"mwms-agent: skipped metrics line {self._line_number} ({error}): {text}")
        self._offset += complete_end
        return points, warnings


def parse_metric_line(raw: bytes, seq: int) -> agent_pb2.MetricPoint:
    """One metrics line (the contract in mwms.metrics_line) as the point with sequence number `seq`."""
    point = metrics_line.decode(raw)
    return agent_pb2.MetricPoint(
        seq=seq, name=point.name, step=point.step, value=point.value, unix_ms=int(point.time * 1000)
    )

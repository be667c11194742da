"""Log lines and metric points a task produced that the coordinator has not acknowledged yet, kept on disk.

Items carry their own `seq` (increasing per task). An acknowledgement is cumulative: `ack(n)` drops every
item with seq <= n. Each outbox is two files in the task's outbox directory:

- `<name>.jsonl`: an append-only spool, one JSON object per item; rewritten (compacted) once most of it is
  acknowledged;
- `<name>.cursor.json`: the acknowledged seq and how far the bound has dropped items, replaced atomically.

So unacknowledged items survive a coordinator restart and an agent restart. A seq is used once: `add`
ignores an item whose seq is not above every seq seen so far (`last_seq`), and a new Outbox on the same
files continues from there. The spool is flushed before items are handed out to be sent, so an item that
left the agent is always on disk (an agent crash loses at most items nobody has seen; a power loss may
lose the page cache too, which is accepted: the spool is not fsynced per line).

Unacknowledged data is bounded (`max_bytes`): past it the oldest items are dropped down to 7/8 of the
bound, and `add` returns how many went, so the caller can say so in the task's log.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import threading
from array import array
from pathlib import Path
from typing import IO, Any, Generic, Protocol, TypeVar

log = logging.getLogger("mwms.agent.outbox")

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
# The spool is rewritten once this much of it is acknowledged and that is at least half of it.
COMPACT_MIN_BYTES = 1024 * 1024


class SeqMessage(Protocol):
    """A protobuf message with scalar fields only, one of them `seq`."""

    @property
    def seq(self) -> int: ...


Item = TypeVar("Item", bound=SeqMessage)


class Outbox(Generic[Item]):
    """Unacknowledged items of one kind for one task, oldest first, spooled under `directory`."""

    def __init__(
        self, directory: Path, name: str, message_type: type[Item], max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self.directory = directory
        self._spool = directory / f"{name}.jsonl"
        self._cursor = directory / f"{name}.cursor.json"
        self._message_type = message_type
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        # Seq and spool offset of every item in the spool; items before `_first` are acked or dropped.
        self._seqs = array("q")
        self._offsets = array("q")
        self._first = 0
        self._end = 0  # bytes in the spool, including what is still in the write buffer
        self._writer: IO[bytes] | None = None
        self._acked_seq = 0
        self._dropped_through = 0
        # Items dropped because the coordinator stayed away while the task kept writing (all runs).
        self.dropped = 0
        self.last_seq = 0
        directory.mkdir(parents=True, exist_ok=True)
        self._load()

    # --- the interface --------------------------------------------------------------------------------
    def add(self, item: Item) -> int:
        """Keeps `item` until an ack covers its seq; returns how many of the oldest items the bound dropped.

        An item whose seq is not above every seq seen so far is ignored (already stored, acked or dropped).
        """
        line = (json.dumps(_to_dict(item), separators=(",", ":")) + "\n").encode()
        with self._lock:
            if item.seq <= self.last_seq:
                return 0
            writer = self._open_writer()
            writer.write(line)
            self._seqs.append(item.seq)
            self._offsets.append(self._end)
            self._end += len(line)
            self.last_seq = item.seq
            if self._end - self._offsets[self._first] > self._max_bytes:
                return self._drop_oldest()
            return 0

    def unacked(self, after: int = 0, limit: int | None = None, max_bytes: int | None = None) -> list[Item]:
        """Unacknowledged items with seq > `after`, oldest first: at most `limit` of them, and at most
        `max_bytes` of them as spooled, but always the first. Spooled, a line's text takes at least the bytes
        it takes serialized (JSON escapes what is not ASCII as \\uXXXX, where UTF-8 takes 2-4 bytes)."""
        with self._lock:
            start = bisect.bisect_right(self._seqs, after, lo=self._first)
            stop = len(self._seqs) if limit is None else min(len(self._seqs), start + limit)
            if start >= stop:
                return []
            if max_bytes is not None:
                stop = min(stop, self._stop_within(start, max_bytes))
            if self._writer is not None:
                self._writer.flush()
            end = self._offsets[stop] if stop < len(self._seqs) else self._end
            with self._spool.open("rb") as reader:
                reader.seek(self._offsets[start])
                data = reader.read(end - self._offsets[start])
        items = []
        for raw in data.splitlines():
            try:
                items.append(self._message_type(**json.loads(raw)))
            except (ValueError, TypeError) as error:
                log.warning("skipping a damaged line in %s: %s", self._spool, error)
        return items

    def _stop_within(self, start: int, max_bytes: int) -> int:
        """The end (exclusive) of the longest run of items from `start` whose spooled bytes fit `max_bytes`:
        at least one item, whatever its size."""
        limit = self._offsets[start] + max_bytes
        beyond = bisect.bisect_right(self._offsets, limit, lo=start)  # the first item starting past it
        if beyond == len(self._offsets) and self._end <= limit:
            return beyond  # every item to the end fits
        return max(start + 1, beyond - 1)  # the item starting at beyond - 1 ends past the limit

    def ack(self, seq: int) -> None:
        """Forgets every item with seq <= `seq`, on disk too."""
        with self._lock:
            if seq <= self._acked_seq:
                return
            self._acked_seq = seq
            self.last_seq = max(self.last_seq, seq)
            self._first = bisect.bisect_right(self._seqs, seq, lo=self._first)
            self._write_cursor()
            self._maybe_compact()

    def __len__(self) -> int:
        with self._lock:
            return len(self._seqs) - self._first

    def close(self) -> None:
        """Flushes and closes the spool (the files stay; a new Outbox on them continues)."""
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    # --- internals ------------------------------------------------------------------------------------
    def _load(self) -> None:
        try:
            cursor = json.loads(self._cursor.read_text())
            self._acked_seq = int(cursor.get("acked_seq", 0))
            self._dropped_through = int(cursor.get("dropped_through_seq", 0))
            self.dropped = int(cursor.get("dropped", 0))
        except FileNotFoundError:
            pass
        except (ValueError, TypeError, AttributeError) as error:
            log.warning("ignoring the damaged outbox cursor %s: %s", self._cursor, error)
        floor = max(self._acked_seq, self._dropped_through)
        self.last_seq = floor
        try:
            data = self._spool.read_bytes()
        except FileNotFoundError:
            return
        lines = data.split(b"\n")[:-1]  # a last line without "\n" was cut by a crash and never sent
        kept: list[bytes] = []
        for raw in lines:
            try:
                seq = int(json.loads(raw)["seq"])
            except (ValueError, KeyError, TypeError):
                continue
            if seq > self.last_seq:
                self._seqs.append(seq)
                self._offsets.append(self._end)
                self._end += len(raw) + 1
                self.last_seq = seq
                kept.append(raw + b"\n")
        if len(kept) != len(lines) or self._end != len(data):
            write_atomically(self._spool, b"".join(kept))

    def _open_writer(self) -> IO[bytes]:
        if self._writer is None:
            self._writer = self._spool.open("ab")
        return self._writer

    def _drop_oldest(self) -> int:
        target = self._max_bytes * 7 // 8
        before = self._first
        while self._first < len(self._seqs) - 1 and self._end - self._offsets[self._first] > target:
            self._first += 1
        count = self._first - before
        if count == 0:
            return 0
        self._dropped_through = self._seqs[self._first - 1]
        self.dropped += count
        log.warning(
            "outbox %s over %d bytes: dropped its %d oldest items (%d so far)",
            self._spool,
            self._max_bytes,
            count,
            self.dropped,
        )
        self._write_cursor()
        self._maybe_compact()
        return count

    def _write_cursor(self) -> None:
        state = {
            "acked_seq": self._acked_seq,
            "dropped_through_seq": self._dropped_through,
            "dropped": self.dropped,
        }
        write_atomically(self._cursor, json.dumps(state).encode())

    def _maybe_compact(self) -> None:
        done_bytes = self._offsets[self._first] if self._first < len(self._seqs) else self._end
        if done_bytes >= COMPACT_MIN_BYTES and done_bytes >= self._end - done_bytes:
            self._rewrite_from(self._first, done_bytes)

    def _rewrite_from(self, first: int, base: int) -> None:
        """Rewrites the spool to hold only items from index `first` (at byte `base`) on."""
        if base == 0 and first == 0:
            return
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        with self._spool.open("rb") as reader:
            reader.seek(base)
            tail = reader.read(self._end - base)
        write_atomically(self._spool, tail)
        self._seqs = self._seqs[first:]
        self._offsets = array("q", (offset - base for offset in self._offsets[first:]))
        self._first = 0
        self._end = len(tail)


def write_atomically(path: Path, data: bytes) -> None:
    """Replaces `path` with `data` so a reader (or an agent crash) sees the old or the new file, never a mix.

    Not fsynced: it runs on every ack, and after a power loss the worst case is a resend of lines the
    coordinator already stored (it ignores duplicates by seq).
    """
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def _to_dict(item: Any) -> dict[str, Any]:
    return {field.name: value for field, value in item.ListFields()}

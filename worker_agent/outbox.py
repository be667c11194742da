"""Log lines and metric points a task produced that the coordinator has not acknowledged yet.

Items carry their own `seq` (increasing per task). An acknowledgement is cumulative: `ack(n)` drops every
item with seq <= n. The interface stays narrow (`add`, `unacked`, `ack`) so the in-memory deque can become a
bounded on-disk buffer later without touching callers.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Generic, Protocol, TypeVar

log = logging.getLogger("mwms.agent.outbox")

DEFAULT_MAX_ITEMS = 100_000


class HasSeq(Protocol):
    @property
    def seq(self) -> int: ...


Item = TypeVar("Item", bound=HasSeq)


class Outbox(Generic[Item]):
    """Unacknowledged items of one kind for one task, oldest first, at most `max_items` of them."""

    def __init__(self, max_items: int = DEFAULT_MAX_ITEMS) -> None:
        self._items: deque[Item] = deque()
        self._acked_seq = 0
        self._max_items = max_items
        self._lock = threading.Lock()
        # Oldest items dropped because the coordinator stayed away while the task kept writing.
        self.dropped = 0

    def add(self, item: Item) -> None:
        """Keeps `item` until an ack covers its seq; items already acked are ignored."""
        with self._lock:
            if item.seq <= self._acked_seq:
                return
            self._items.append(item)
            if len(self._items) > self._max_items:
                self._items.popleft()
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 10_000 == 0:
                    log.warning(
                        "outbox full (%d items): dropped %d oldest so far", self._max_items, self.dropped
                    )

    def unacked(self, after: int = 0, limit: int | None = None) -> list[Item]:
        """Unacknowledged items with seq > `after`, oldest first, at most `limit` of them."""
        with self._lock:
            selected: list[Item] = []
            for item in self._items:
                if item.seq <= after:
                    continue
                selected.append(item)
                if limit is not None and len(selected) >= limit:
                    break
            return selected

    def ack(self, seq: int) -> None:
        """Forgets every item with seq <= `seq`."""
        with self._lock:
            self._acked_seq = max(self._acked_seq, seq)
            while self._items and self._items[0].seq <= self._acked_seq:
                self._items.popleft()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

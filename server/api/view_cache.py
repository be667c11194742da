"""The dashboard's polled lists, built once for everyone who asks within a second.

Ten open dashboards poll /agents, /jobs, /overview and /queue every 2 s. Those answers are the same for
every caller who may read them, and at 1,000 agents the agents list alone is half a megabyte of JSON that
took an API replica about 30 ms of CPU to read and serialise each time. An answer built here is served
again, as the same bytes, to whoever asks for the same list within `ttl_s`, and never after a request
that may write (any method but GET, HEAD and OPTIONS) was answered by this process, so a caller reads its
own writes at once. What agents, the background loops and other replicas change shows within `ttl_s`
(`MWMS_VIEW_CACHE_S`; 0 turns the cache off).

Requests for the same list that arrive while it is being built wait for that build instead of starting
their own. Callers are authenticated before their request gets here; only lists whose content does not
depend on who asks may be cached.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mwms.server.api.auth import SAFE_METHODS

# At most this many distinct lists (endpoint and query) and bytes are kept; the least recently used go.
MAX_ENTRIES = 32
MAX_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class _Entry:
    generation: int
    built_at: float
    body: bytes


class ViewCache:
    """Serialised answers keyed by endpoint and query, valid for `ttl_s` and until the next `invalidate()`."""

    def __init__(
        self,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = MAX_ENTRIES,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self.ttl_s = ttl_s
        self._generation = 0
        self._clock = clock
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._bytes = 0
        self._guard = threading.Lock()
        self._building: dict[Hashable, threading.Lock] = {}

    def get(self, key: Hashable, build: Callable[[], bytes]) -> bytes:
        """The answer for `key`: a fresh one kept here, else `build()`'s (one build at a time per key)."""
        if self.ttl_s <= 0:
            return build()
        body = self._fresh(key)
        if body is not None:
            return body
        with self._guard:
            lock = self._building.setdefault(key, threading.Lock())
        try:
            with lock:
                body = self._fresh(key)  # built by the request this one waited for
                if body is not None:
                    return body
                # Read before building: a write answered meanwhile makes this answer stale at once.
                generation, built_at = self._generation, self._clock()
                body = build()
                self._keep(key, _Entry(generation, built_at, body))
                return body
        finally:
            with self._guard:
                if self._building.get(key) is lock and not lock.locked():
                    del self._building[key]

    def invalidate(self) -> None:
        """Every answer kept so far is stale: something they were read from may have changed."""
        with self._guard:
            self._generation += 1

    def json(self, key: Hashable, adapter: TypeAdapter[Any], build: Callable[[], Any]) -> Response:
        """`build()`'s value as JSON, as FastAPI would answer it for the endpoint's response model."""
        body = self.get(key, lambda: adapter.dump_json(build(), by_alias=True))
        return Response(body, media_type="application/json")

    def _fresh(self, key: Hashable) -> bytes | None:
        with self._guard:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry.generation != self._generation or self._clock() - entry.built_at >= self.ttl_s:
                return None
            self._entries.move_to_end(key)
            return entry.body

    def _keep(self, key: Hashable, entry: _Entry) -> None:
        if len(entry.body) > self._max_bytes:
            return
        with self._guard:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= len(old.body)
            self._entries[key] = entry
            self._bytes += len(entry.body)
            while len(self._entries) > self._max_entries or self._bytes > self._max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= len(evicted.body)


class InvalidateOnWrites:
    """ASGI middleware: once a request that may have written starts its answer (its transaction is
    committed by then), the answers kept in `cache` are stale, so its caller reads what it wrote."""

    def __init__(self, app: ASGIApp, cache: ViewCache) -> None:
        self.app = app
        self.cache = cache

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS:
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.cache.invalidate()
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.cache.invalidate()  # also when it failed before answering

"""HTTP/1.1 connections held to the bounds uvicorn leaves open: the size of a request head, and the time a
client may take to send a head or to pause a body.

uvicorn serves with httptools, which has no bound on a request head of its own: it gathers a header by
concatenating the pieces that arrive, at a cost that grows faster than the header (64 MB held the event
loop 4 s, 128 MB 12-20 s), and gRPC agents and every other request waited behind it. uvicorn also times out only idle keep-alive
connections; one that sends a byte every few seconds (slowloris) stays open for ever.

`bounded_http_protocol(bounds)` makes a subclass of uvicorn's httptools protocol that
- counts the bytes of each request head and answers 431 (then closes) as soon as they pass
  `max_head_bytes`: the reads of a head that is still arriving, so the parser never holds more than the
  bound plus one read, and the URL and headers the parser hands over, for a head that came in one read;
- closes a connection that has not sent a complete head `head_timeout_s` after it opened or after its
  last answer went out (408 when part of a head arrived), and one that opened and sent nothing after
  the keep-alive time, as uvicorn already does after an answer;
- closes a connection whose request body pauses for `body_idle_timeout_s` while the coordinator waits
  for it (the route sees a client that went away).

h11 (`http="h11"`, `h11_max_incomplete_event_size`) bounds the head too, and under the same flood kept
/healthz about as fast (p99 13-25 ms against 15-43 ms, 2-core machine); but it answers 400, parses every
request in Python (/healthz back to back 1.54-1.80 ms against 1.37-1.69 ms) and has neither timeout, which
need a protocol subclass either way.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import ClassVar

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from mwms.server.limits import HttpBounds, head_timeout_message, head_too_large_message

# The request line and the blank line after the headers, besides the URL (the method, spaces, version).
REQUEST_LINE_BYTES = 16


class _HeadTooLarge(Exception):
    """Raised in a parser callback: httptools stops, and uvicorn answers through send_400_response."""


class BoundedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bound on request heads and timeouts for slow clients."""

    bounds: ClassVar[HttpBounds]

    # uvicorn makes one instance per connection, always with these keywords (uvicorn/server.py).
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._reading_head = True  # the next bytes belong to a request head
        self._head_bytes = 0  # bytes read since the head began (a bound on its size while it is incomplete)
        self._head_size = 0  # the head's size, from what the parser handed over
        self._head_refused = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._reading_body = False
        self._last_data_at = 0.0
        self._body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # uvicorn arms its keep-alive timer only after an answer: a connection that never sends a byte
        # would stay open.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._reading_head:
            self._head_bytes += len(data)
        self._last_data_at = time.monotonic()
        super().data_received(data)
        if self.transport.is_closing():
            return
        # Counted per read: a read that ends one request and starts the next counts from the next read on,
        # so a head can pass the bound by at most one read (256 KiB) before it is refused.
        if self._reading_head and self._head_bytes > self.bounds.max_head_bytes:
            self._refuse(431, head_too_large_message(self.bounds.max_head_bytes))
            return
        if self._reading_body and self._body_timer is None:
            self._body_timer = self.loop.call_later(self.bounds.body_idle_timeout_s, self._check_body)

    # Parser callbacks (called from inside data_received).
    def on_message_begin(self) -> None:
        self._head_size = REQUEST_LINE_BYTES
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._grow_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._grow_head(len(name) + len(value) + 4)  # ": " and CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._cancel_head_timer()
        # A WebSocket upgrade hands the connection to another protocol, with its own timeouts.
        self._reading_body = not (self.parser.should_upgrade() and self._should_upgrade())
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._reading_body = False
        self._reading_head = True
        self._head_bytes = 0
        super().on_message_complete()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            self._arm_head_timer()  # the client's turn again

    def _grow_head(self, size: int) -> None:
        self._head_size += size
        if self._head_size > self.bounds.max_head_bytes:
            self._head_refused = True
            raise _HeadTooLarge

    def send_400_response(self, msg: str) -> None:
        if self._head_refused:
            self._refuse(431, head_too_large_message(self.bounds.max_head_bytes))
        else:
            super().send_400_response(msg)

    # Timers.
    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.bounds.head_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a pipelined head waits on our answer; the timer starts again when it is sent
        # No head completed since the timer started: the head is slow, or the body of a request that was
        # answered early (401, 413) is still arriving.
        if self._reading_head and self._head_bytes:
            self._refuse(408, head_timeout_message(self.bounds.head_timeout_s))
        else:
            self.transport.close()

    def _check_body(self) -> None:
        self._body_timer = None
        if self.transport.is_closing() or not self._reading_body:
            return
        if self.cycle is not None and self.cycle.response_complete:
            return  # answered without the body: the head timer runs again
        idle = time.monotonic() - self._last_data_at
        if self.flow.read_paused or idle < self.bounds.body_idle_timeout_s:
            # Paused: the route has not taken what arrived, which is no fault of the client's.
            wait = self.bounds.body_idle_timeout_s - (0.0 if self.flow.read_paused else idle)
            self._body_timer = self.loop.call_later(wait, self._check_body)
            return
        if self.cycle is not None:
            self.cycle.disconnected = True  # the route's answer, if it makes one, goes nowhere
        self.transport.close()

    def _refuse(self, status: int, detail: str) -> None:
        """Answers `status` (unless an answer is under way on this connection) and closes it."""
        answering = self.cycle is not None and not self.cycle.response_complete
        if not answering:
            body = json.dumps({"detail": detail}).encode()
            head = [STATUS_LINE[status]]
            for name, value in self.server_state.default_headers:
                head += [name, b": ", value, b"\r\n"]
            head += [
                b"content-type: application/json\r\n",
                b"content-length: " + str(len(body)).encode() + b"\r\n",
                b"x-content-type-options: nosniff\r\n",
                b"connection: close\r\n\r\n",
            ]
            self.transport.write(b"".join(head) + body)
        elif self.cycle is not None:
            self.cycle.disconnected = True
        self.transport.close()


def bounded_http_protocol(bounds: HttpBounds) -> type[BoundedHttpProtocol]:
    """The protocol class to pass uvicorn as `http=`, held to `bounds`."""
    return type("BoundedHttpProtocol", (BoundedHttpProtocol,), {"bounds": bounds})

"""The bound on request bodies: refused on Content-Length before a byte is read, cut off while reading.

Bundle uploads are left to their own route, which streams them to disk under MWMS_MAX_UPLOAD_BYTES.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Routes that take large bodies and bound them themselves.
UPLOAD_ROUTES = frozenset({("POST", "/api/v1/bundles")})


def too_large_message(limit: int) -> str:
    return (
        f"the request body is over {limit} bytes ({limit / 1024 / 1024:g} MiB), the limit for API requests "
        "(MWMS_MAX_REQUEST_BODY_BYTES): keep job specs small and put large configuration in a file in "
        "the bundle"
    )


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_413(send: Send, limit: int) -> None:
    body = json.dumps({"detail": too_large_message(limit)}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    """Answers 413 for a body over `max_bytes` (uploads excepted), before or while the app reads it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"], scope["path"]) in UPLOAD_ROUTES:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _send_413(send, self.max_bytes)
            return
        received = 0
        refused = False

        async def limited_receive() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Answer now; the app sees a client that went away and its own answer is dropped.
                    refused = True
                    await _send_413(send, self.max_bytes)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if not refused:
                await send(message)

        await self.app(scope, limited_receive, guarded_send)

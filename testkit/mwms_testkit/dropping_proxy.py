"""A TCP proxy on loopback that can lose a response: the request reaches the upstream server, which acts on
it and answers, but the proxy closes the client's connection instead of passing the answer on.

That is what a client sees when a connection drops at the worst moment (a load balancer restart, a laptop
changing networks): it cannot know whether its POST took effect.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class DroppingProxy:
    upstream: tuple[str, int]
    # Requests whose first line starts with this lose their response, `drops_left` times.
    drop_prefix: bytes = b"POST /api/v1/jobs "
    drops_left: int = 0
    requests_seen: list[bytes] = field(default_factory=list)
    dropped: int = 0
    port: int = 0
    _listener: socket.socket | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            connection = _Connection(client, upstream)
            threading.Thread(target=self._requests, args=(connection,), daemon=True).start()
            threading.Thread(target=self._responses, args=(connection,), daemon=True).start()

    def _requests(self, connection: _Connection) -> None:
        while chunk := _receive(connection.client):
            # httpx writes a request's head in one piece, so a request line starts a chunk.
            if chunk[:4].isupper() and b" /" in chunk[:12]:
                self.requests_seen.append(chunk.split(b"\r\n", 1)[0])
                with self._lock:
                    if chunk.startswith(self.drop_prefix) and self.drops_left > 0:
                        self.drops_left -= 1
                        connection.drop_response = True
            try:
                connection.upstream.sendall(chunk)
            except OSError:
                break
        connection.close()

    def _responses(self, connection: _Connection) -> None:
        while chunk := _receive(connection.upstream):
            if connection.drop_response:
                # The upstream has handled the request and started answering: lose the answer.
                self.dropped += 1
                break
            try:
                connection.client.sendall(chunk)
            except OSError:
                break
        connection.close()


@dataclass
class _Connection:
    client: socket.socket
    upstream: socket.socket
    drop_response: bool = False

    def close(self) -> None:
        for side in (self.client, self.upstream):
            try:
                side.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            side.close()


def _receive(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


@contextmanager
def dropping_proxy(upstream_port: int, drops: int) -> Iterator[DroppingProxy]:
    """A proxy to 127.0.0.1:`upstream_port` that loses the responses of the first `drops` job submits."""
    proxy = DroppingProxy(upstream=("127.0.0.1", upstream_port), drops_left=drops)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()

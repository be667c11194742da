"""The one way tests serve an ASGI app over real HTTP in-process: uvicorn in a thread, on a loopback port it
bound itself, for a fake API (no lifespan) or a real coordinator (`lifespan=True`: its gRPC server, loops).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


@contextmanager
def served(app: Any, *, lifespan: bool = False, port: int = 0, start_timeout_s: float = 30) -> Iterator[str]:
    """Serves `app` on 127.0.0.1:`port` (default: a free one) until the block ends; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    config = uvicorn.Config(app, log_level="warning", lifespan="on" if lifespan else "off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + start_timeout_s
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError(f"the app did not start serving within {start_timeout_s:g} s")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()

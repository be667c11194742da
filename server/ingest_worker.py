"""The ingest process: stores the agents' log lines and metric points in an interpreter of its own.

The coordinator (server/live/ingest_process.py) starts `python -m mwms.server.ingest_worker`, writes its
configuration as the first line on stdin (the database URL, which may hold a password, never goes on the
command line), then one request frame per group of batches (server/live/ingest_wire.py). For each, in
order, the process decodes the batches (server/rpc/convert.py, the coordinator's one conversion module),
stores them in one transaction on its own connection to the same database
(server/live/ingest_store.py: SQLite's write lock, or PostgreSQL's writer lock, serialises it with the
coordinator's other writers) and answers one reply frame: each batch's outcome, the agents to wake, how
long it held the write lock, and the metric updates it made (server/observability/metric_relay.py).

It lives beside server/main.py rather than in server/live/ because it decodes protobuf, which the live
machinery never imports. The protocol goes on the process's original stdout; anything else printed goes
to stderr, the coordinator's log stream, formatted as the coordinator's log. It ends when stdin closes:
its coordinator stopped or died.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from typing import IO, Any

log = logging.getLogger("mwms.server.ingest")
# Added to the process's nice value: when the machine's cores are all busy, the coordinator's event loop
# (heartbeats, REST) runs before telemetry is stored, which then waits (the streams' backpressure holds
# the agents' batches), never the other way round. With a core to spare it changes nothing.
NICENESS = 10


def _protocol_stream() -> IO[bytes]:
    """The original stdout, for reply frames only; fd 1 (and sys.stdout) now write to stderr."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def _read_exactly(stream: IO[bytes], count: int) -> bytes | None:
    """`count` bytes, or None at the end of the stream (between frames)."""
    data = stream.read(count)
    if not data:
        return None
    if len(data) < count:
        raise EOFError(f"the stream ended inside a frame ({len(data)} of {count} bytes)")
    return data


def serve(config: dict[str, Any], requests: IO[bytes], replies: IO[bytes]) -> None:
    """Answers one reply frame per request frame until `requests` ends."""
    from mwms.server.db.engine import Database
    from mwms.server.heap import settle_heap
    from mwms.server.live.ingest_store import store_group
    from mwms.server.live.ingest_wire import LENGTH, READY, decode_request, encode_reply, frame, frame_length
    from mwms.server.observability import metric_relay
    from mwms.server.rpc.convert import telemetry_items

    relay = metric_relay.capture()
    db = Database(config["url"])
    settle_heap()  # what the imports left behind stays out of every collection (server/heap.py)
    replies.write(frame(READY))
    replies.flush()
    try:
        while (prefix := _read_exactly(requests, LENGTH.size)) is not None:
            body = _read_exactly(requests, frame_length(prefix))
            if body is None:
                raise EOFError("the stream ended inside a frame")
            number, batches = decode_request(body)
            try:
                stored = store_group(db, batches, telemetry_items)
                reply = encode_reply(number, stored, relay.take())
            except Exception as failure:  # noqa: BLE001 - told to the coordinator, whose streams decide
                log.exception("a telemetry transaction failed")
                reply = encode_reply(number, None, relay.take(), failure)
            replies.write(reply)
            replies.flush()
    finally:
        db.engine.dispose()


def main() -> int:
    # Its coordinator ends it (stdin closes); Ctrl-C at a terminal reaches the whole process group.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.nice(NICENESS)
    replies = _protocol_stream()
    requests = sys.stdin.buffer
    first = requests.readline()
    if not first:
        return 0
    config = json.loads(first)
    from mwms.log_setup import configure_logging

    configure_logging(config.get("log_format", "text"), config.get("log_level", "info"))
    try:
        serve(config, requests, replies)
    except BrokenPipeError:
        # Its coordinator died (a kill -9, the OOM killer) while it answered: nobody is left to read
        # the reply, and the next coordinator stores again what was not acknowledged.
        log.info("the coordinator stopped reading the ingest process's replies; stopping")
        _discard(replies)
    return 0


def _discard(stream: IO[bytes]) -> None:
    """Points `stream`'s descriptor at /dev/null, so flushing it at exit raises nothing more."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())

"""The scheduler process: runs the coordinator's scheduler passes in an interpreter of its own.

A pass over 10,000 waiting jobs is pure Python for tens to hundreds of milliseconds; in the coordinator's
process it held the interpreter that answers agents' heartbeats and REST calls. Here it runs apart: the
coordinator (server/live/scheduler_process.py) starts `python -m mwms.server.live.scheduler_worker`,
writes its configuration as the first line on stdin (the database URL, which may hold a password, never
goes on the command line), then one request line per pass. Each request names the agents whose streams
the coordinator holds; the process runs `schedule_pass` (server/services/scheduler/scheduling.py) on its own
connection to the same database (SQLite's write lock, or PostgreSQL's writer lock, serialises it with the
coordinator's writers) and answers one line: the agents that got tasks or stops, the pass's time, and
the metric updates it made (server/observability/metric_relay.py). It keeps the waiting-jobs cache
between passes, as the coordinator did.

The protocol goes on the process's original stdout; anything else printed goes to stderr, the
coordinator's log stream, formatted as the coordinator's log. It ends when stdin closes: its coordinator
stopped or died.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import sys
import time
from typing import IO, Any

log = logging.getLogger("mwms.server.scheduling")
# Passes between two full garbage collections (the others collect the young generations only).
FULL_COLLECTION_EVERY = 20


def _protocol_stream() -> IO[str]:
    """The original stdout, for replies only; fd 1 (and sys.stdout) now write to stderr."""
    out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def serve(config: dict[str, Any], requests: IO[str], replies: IO[str]) -> None:
    """Answers one reply line per request line until `requests` ends."""
    from mwms.server.db.engine import Database
    from mwms.server.observability import metric_relay
    from mwms.server.services.fleet import replicas
    from mwms.server.services.scheduler.scheduling import SharingPolicy, schedule_pass
    from mwms.server.services.scheduler.waiting_jobs import WaitingJobs

    relay = metric_relay.capture()
    db = Database(config["url"])
    policy = SharingPolicy(**config["policy"])
    replica_id = str(config.get("replica_id") or "")
    waiting = WaitingJobs()
    # Collection runs between passes, not inside one: the waiting-jobs cache keeps tens of thousands of
    # objects alive, and an automatic full collection in the middle of a pass doubled its time.
    gc.disable()
    passes = 0
    try:
        for line in requests:
            request = json.loads(line)
            held = frozenset(str(a) for a in request.get("held", []))
            began = time.perf_counter()
            touched: list[str] = []
            phases: dict[str, float] = {}
            error = None
            try:
                connected = held
                if db.is_postgres:
                    with db.read() as session:
                        connected = held | replicas.streams_elsewhere(session, replica_id)
                touched = schedule_pass(
                    db, connected=connected, policy=policy, waiting_jobs=waiting, phases=phases
                )
            except Exception as failure:  # noqa: BLE001 - told to the coordinator, which retries
                log.exception("scheduler pass failed")
                error = f"{type(failure).__name__}: {failure}"[:1000]
            reply = {
                "touched": touched,
                "seconds": time.perf_counter() - began,
                "phases": {name: round(value, 6) for name, value in phases.items()},
                "metrics": relay.take(),
                "error": error,
            }
            replies.write(json.dumps(reply) + "\n")
            replies.flush()
            passes += 1
            gc.collect(2 if passes % FULL_COLLECTION_EVERY == 0 else 1)
    finally:
        gc.enable()
        db.engine.dispose()


def main() -> int:
    # Its coordinator ends it (stdin closes); Ctrl-C at a terminal reaches the whole process group.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replies = _protocol_stream()
    first = sys.stdin.readline()
    if not first:
        return 0
    config = json.loads(first)
    from mwms.log_setup import configure_logging

    configure_logging(config.get("log_format", "text"), config.get("log_level", "info"))
    try:
        serve(config, sys.stdin, replies)
    except BrokenPipeError:
        # Its coordinator died (a kill -9) while it answered: nobody reads the reply; the next leader's
        # scheduler process plans from the database.
        log.info("the coordinator stopped reading the scheduler process's replies; stopping")
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, replies.fileno())  # flushing it at exit raises nothing more
        os.close(devnull)
    return 0


if __name__ == "__main__":
    sys.exit(main())

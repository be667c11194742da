"""The doorbell between replicas: PostgreSQL LISTEN/NOTIFY, with the hub's sweep as the fallback.

Commands live in the database (a task ASSIGNED is its start, a stop request its stop: written in the same
transaction as the decision); what a replica cannot know is that another replica decided one for an
agent whose stream it holds. So after a decision the deciding replica rings (`publish`): a NOTIFY on
CHANNEL naming the agents; every replica LISTENs and wakes the ones it holds (server/live/hub.py), which
reads their commands from the database as it does for its own decisions. A ring that is lost (the
deciding replica died between its commit and the NOTIFY, or a listener was reconnecting) costs only time:
the hub sweeps every agent it holds every few seconds on PostgreSQL, and after the listener reconnects.

Payloads: "agents:ID,ID,..." (at most PAYLOAD_BYTES each; more ids go in several), "agents:*" (every
agent: a removal, a cancel through the REST API), "stacks:REQUEST_ID" (server/live/stack_collector.py),
"scheduler:REPLICA_ID" (a poke on a replica that does not lead the scheduler: server/live/loops.py).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable

from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from mwms.loop import Backoff
from mwms.server.db.engine import Database
from mwms.server.services.fleet import replicas

log = logging.getLogger("mwms.server.notify")
CHANNEL = "mwms_wake"
# PostgreSQL refuses payloads of 8,000 bytes or more.
PAYLOAD_BYTES = 7000
LISTEN_POLL_S = 1.0


def payloads(kind: str, items: Iterable[str]) -> list[str]:
    """`kind:a,b,...` payloads of at most PAYLOAD_BYTES each, covering every item."""
    out: list[str] = []
    current: list[str] = []
    size = len(kind) + 1
    for item in items:
        if current and size + len(item) + 1 > PAYLOAD_BYTES:
            out.append(f"{kind}:{','.join(current)}")
            current, size = [], len(kind) + 1
        current.append(item)
        size += len(item) + 1
    if current:
        out.append(f"{kind}:{','.join(current)}")
    return out


class Doorbell:
    """Publishes rings and listens for the others' on one PostgreSQL database; inert on SQLite."""

    def __init__(self, db: Database, loop: asyncio.AbstractEventLoop, replica_id: str = "") -> None:
        self._db = db
        self._loop = loop
        # The listener's connection names the replica (pg_stat_activity.application_name): PostgreSQL drops
        # it the moment the replica dies, which is how the others tell at once (services/fleet/replicas.py).
        self._application_name = replicas.application_name(replica_id) if replica_id else "mwms-listener"
        self.enabled = db.is_postgres
        self._handlers: dict[str, Callable[[list[str]], None]] = {}
        self._on_reconnect: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.listening = threading.Event()  # set while LISTEN is in place

    def on(self, kind: str, handler: Callable[[list[str]], None]) -> None:
        """Calls `handler(items)` in the event loop for every ring of `kind` ("*" stays an item)."""
        self._handlers[kind] = handler

    def on_reconnect(self, callback: Callable[[], None]) -> None:
        """Called in the event loop once LISTEN is back after a break (rings may have been missed)."""
        self._on_reconnect.append(callback)

    async def ring(self, kind: str, items: Iterable[str]) -> None:
        """Sends the rings for `items` (each NOTIFY its own autocommit statement); errors are logged."""
        if not self.enabled:
            return
        messages = payloads(kind, items)
        if not messages:
            return

        def send() -> None:
            with self._db.engine.connect() as connection:
                for payload in messages:
                    connection.execute(select(func.pg_notify(CHANNEL, payload)))
                connection.commit()

        try:
            await asyncio.to_thread(send)
        except Exception as error:  # noqa: BLE001 - the sweep delivers what a lost ring did not
            log.warning(
                "could not ring the other replicas (%s); their sweep delivers it", type(error).__name__
            )

    def start(self) -> None:
        if not self.enabled:
            return
        self._thread = threading.Thread(target=self._listen_forever, name="notify-listener", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, LISTEN_POLL_S + 5)

    def _conninfo(self) -> str:
        url = make_url(self._db.url).set(drivername="postgresql")
        return url.render_as_string(hide_password=False)

    def _listen_forever(self) -> None:
        import psycopg  # the postgres extra: only a coordinator on PostgreSQL gets here

        backoff = Backoff(initial=0.2, maximum=2.0)
        first = True
        while not self._stop.is_set():
            try:
                with psycopg.connect(
                    self._conninfo(),
                    autocommit=True,
                    connect_timeout=5,
                    application_name=self._application_name,
                ) as connection:
                    connection.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    backoff.reset()
                    if not first:
                        log.info("listening for the other replicas' rings again")
                        for callback in self._on_reconnect:
                            self._loop.call_soon_threadsafe(callback)
                    first = False
                    while not self._stop.is_set():
                        for note in connection.notifies(timeout=LISTEN_POLL_S):
                            self._heard(note.payload)
            except Exception as error:  # noqa: BLE001 - reconnect; the hub sweeps faster meanwhile
                self.listening.clear()
                if self._stop.is_set():
                    return
                log.warning("listening for the other replicas lost (%s); reconnecting", type(error).__name__)
                first = False
                self._stop.wait(backoff.next_delay())
        self.listening.clear()

    def _heard(self, payload: str) -> None:
        kind, _, rest = payload.partition(":")
        handler = self._handlers.get(kind)
        if handler is None or not rest:
            return
        items = rest.split(",")
        self._loop.call_soon_threadsafe(handler, items)

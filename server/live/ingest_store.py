"""One telemetry transaction: a group of log and metric batches, as the agents' streams handed them over, stored.

A stream hands the telemetry writer (server/live/ingest.py) each batch as the protobuf bytes it came in
(`RawBatch`): nothing is converted per line or point in the event loop that answers agents. `store_group`
decodes the group (outside the transaction, so the write lock is held only to store), stores it in one
transaction (services.fleet.agent_messages.accept_telemetry: every batch in a savepoint of its own,
exactly once through the unique (task_id, seq) constraints) and says what became of each batch, which
agents its changes gave commands to, and how long it held the write lock.

It runs in the ingest process (server/ingest_worker.py, the default: server/live/ingest_process.py is
its coordinator side), or in a thread of the coordinator (`ThreadStore`, settings.ingest_process off, or
an in-memory database). Either way the same rules hold:
- a batch that cannot be decoded, or cannot be applied, gets its exception as its outcome (its stream
  refuses it, with why; or ends, when the agent was removed: a DomainError), the others are stored;
- a database that cannot be written (a transient error) fails the whole group: every stream ends and its
  agent resends what was not acknowledged;
- storing a group again stores nothing twice, so a group whose answer was lost can simply be sent again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from mwms.server.db.engine import Database
from mwms.server.services.fleet.agent_messages import TelemetryBatch, accept_telemetry
from mwms.server.services.fleet.command_targets import track_command_targets
from mwms.server.services.observing.telemetry import IncomingLine, IncomingPoint, StoreOutcome

KINDS = ("logs", "metrics")
# Decodes a batch's bytes into its lines ("logs") or points ("metrics"): server/rpc/convert.py's
# telemetry_items, handed in by whoever starts the store (the live machinery imports no transport).
Decode = Callable[[str, bytes], "list[IncomingLine] | list[IncomingPoint]"]


@dataclass(frozen=True)
class RawBatch:
    """One LogBatch or MetricBatch of an agent's stream, as it came: serialized, not converted."""

    agent_id: str  # the agent the stream's credential proved
    task_id: str
    kind: str  # "logs" or "metrics"
    payload: bytes  # the serialized LogBatch or MetricBatch
    size: int  # lines or points in it


@dataclass
class StoredGroup:
    """What one transaction did: an outcome per batch (in order), agents to wake, the write lock's hold."""

    outcomes: list[StoreOutcome | Exception]
    targets: set[str] = field(default_factory=set)
    held_s: float = 0.0
    # The store lost an answer (its process died) and stored the group again: a change the lost answer
    # reported (a job failed on a NaN) may not be in `outcomes`, so everyone concerned is told anyway.
    answer_lost: bool = False


class GroupStore(Protocol):
    """Where the telemetry writer's transactions run: the ingest process, or a thread."""

    # Groups the writer may hand over before the first is stored (a process reads the next meanwhile).
    parallel: int

    async def store(self, batches: list[RawBatch]) -> StoredGroup:
        """Stores `batches` in one transaction; raises what failed the whole group."""
        ...

    async def stop(self) -> None: ...


def store_group(db: Database, batches: Sequence[RawBatch], decode: Decode) -> StoredGroup:
    """Decodes and stores `batches` in one transaction (see the module's docstring for the rules)."""
    decoded: list[TelemetryBatch | Exception] = []
    for raw in batches:
        try:
            items = decode(raw.kind, raw.payload)
        except Exception as error:  # noqa: BLE001 - a damaged batch is refused alone
            decoded.append(error)
            continue
        if raw.kind == "logs":
            decoded.append(TelemetryBatch(raw.agent_id, raw.task_id, lines=items))  # type: ignore[arg-type]
        else:
            decoded.append(TelemetryBatch(raw.agent_id, raw.task_id, points=items))  # type: ignore[arg-type]
    storable = [d for d in decoded if isinstance(d, TelemetryBatch)]
    targets: set[str] = set()
    held_s = 0.0
    stored: list[StoreOutcome | Exception] = []
    if storable:
        with db.write() as session:
            session.connection()  # BEGIN (IMMEDIATE on SQLite): the write lock is ours from here
            locked_at = time.monotonic()
            targets = track_command_targets(session)
            stored = accept_telemetry(session, storable)
        held_s = time.monotonic() - locked_at
    outcomes = iter(stored)
    return StoredGroup(
        outcomes=[d if isinstance(d, Exception) else next(outcomes) for d in decoded],
        targets=targets,
        held_s=held_s,
    )


class ThreadStore:
    """Transactions in a thread of the coordinator's process (no ingest process)."""

    parallel = 1

    def __init__(self, db: Database, decode: Decode) -> None:
        self._db = db
        self._decode = decode

    async def store(self, batches: list[RawBatch]) -> StoredGroup:
        return await asyncio.to_thread(store_group, self._db, batches, self._decode)

    async def stop(self) -> None:
        return None

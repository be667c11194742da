"""What one replica heard from its agents since its last flush, written in one transaction: their liveness
and warm pools, then its own beat (or its stop), which claims back the streams it holds.

Those are three statements over agent rows, each in id order; between two of them, a writer locking
agents in id order (a reconciler's pass, another replica's flush) could close a cycle, which PostgreSQL
ends by aborting one side (a kill storm's flush failed all its tries that way and wrote nothing that
second). So every agent row the transaction writes is locked first, in id order, in one statement: the
one order every writer of several agents takes them in.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from mwms.server.db.models import Agent
from mwms.server.services.fleet import replicas
from mwms.server.services.fleet.agents import record_heartbeats, record_warm_pools


def lock_agents_in_order(session: Session, agent_ids: Iterable[str]) -> None:
    """Locks the agents' rows in id order (PostgreSQL; SQLite has one writer at a time)."""
    if session.get_bind().dialect.name != "postgresql":
        return
    ids = sorted(set(agent_ids))
    for start in range(0, len(ids), replicas.RECLAIM_CHUNK):  # ascending chunks: still one order
        session.execute(
            select(Agent.id)
            .where(Agent.id.in_(ids[start : start + replicas.RECLAIM_CHUNK]))
            .order_by(Agent.id)
            .with_for_update()
        )


def write_heard(
    session: Session,
    replica: replicas.ReplicaIdentity,
    seen: dict[str, datetime],
    pools: dict[str, tuple[int, int]],
    held: Collection[str],
    loops: list[str],
    timeout_s: float,
    stopping: bool = False,
) -> None:
    """Writes what `replica` heard (`seen`: agent id -> when; `pools`: warm pools said) and its beat with
    the streams it holds and the loops it leads; `stopping`: that it stopped instead of a beat."""
    streams: Collection[str] = () if stopping else held
    lock_agents_in_order(session, [*seen, *pools, *streams])
    record_heartbeats(session, seen, timeout_s)
    record_warm_pools(session, pools)
    if stopping:
        replicas.stop(session, replica)
    else:
        replicas.beat(session, replica, len(held), loops, streams=held)

"""Coordinator replicas on one database: each one's beat, which agent streams each holds, who is alive.

Every replica writes its row about once a second (`beat`, from server/live/loops.py); one not seen for
REPLICA_TIMEOUT_S is listed as gone. An agent's stream belongs to the replica that accepted its newest hello
(`claim_stream`, one more epoch each time): only that replica delivers the agent's commands, and a replica
whose stream is older closes it (server/live/hub.py). A replica's streams count for placement only while it
beats within REPLICA_FRESH_S and, where the database can tell, its listening connection is still there
(`connected_replicas`); when it dies, its agents are moving (`release_streams_of_the_dead`). Liveness of
agents stays in `agents.online_until`, which every replica writes for the agents it hears from;
`silence_verdict` says what an agent's expired liveness means.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, text, update
from sqlalchemy.orm import Session
from sqlalchemy.sql.selectable import ScalarSelect

from mwms.server.db.models import Agent, Replica, utcnow

# A replica not seen for this long is gone (it beats about every second).
REPLICA_TIMEOUT_S = 10.0
# Its streams are trusted for placement, and its agents' silence taken as their own, only while its beats
# are this fresh: a killed replica's agents are moving, so nothing waits on them and none counts as lost.
REPLICA_FRESH_S = 3.0
APPLICATION_PREFIX = "mwms-replica-"
# A replica beats about every second: one whose last beat is older than this has missed one.
MISSED_BEAT_S = 1.5
RECLAIM_CHUNK = 5000  # agent ids per statement (PostgreSQL takes 65,535 parameters)
# Rows of replicas gone this long are deleted.
FORGET_AFTER = timedelta(days=7)
SERVE_ROLES = ("api", "agents", "both")


@dataclass
class ReplicaIdentity:
    """What a replica says about itself; `id` is new at every start, the addresses are set once bound."""

    id: str
    name: str
    http_address: str
    grpc_address: str
    version: str
    serve: str
    pid: int


@dataclass
class ReplicaView(ReplicaIdentity):
    """A replica as the database holds it, as of a moment (`alive`)."""

    started_at: datetime
    seen_at: datetime
    stopped_at: datetime | None
    alive: bool
    agents_held: int
    loops: list[str]


def beat(
    session: Session,
    me: ReplicaIdentity,
    agents_held: int,
    loops: list[str],
    now: datetime | None = None,
    streams: Collection[str] = (),
) -> None:
    """Writes that `me` is alive now, with the streams it holds and the loops it leads.

    `streams`: the agents whose streams it holds; one that the database says holds none (released as a
    dead replica's while this one only looked dead, release_streams_of_the_dead) is claimed back."""
    now = now or utcnow()
    ids = sorted(streams) if session.get_bind().dialect.name == "postgresql" else []
    for start in range(0, len(ids), RECLAIM_CHUNK):
        session.execute(
            update(Agent)
            .where(Agent.id.in_(ids[start : start + RECLAIM_CHUNK]), Agent.stream_replica.is_(None))
            .values(stream_replica=me.id)
        )
    row = session.get(Replica, me.id)
    if row is None:
        session.add(
            Replica(
                id=me.id,
                name=me.name,
                http_address=me.http_address,
                grpc_address=me.grpc_address,
                version=me.version,
                serve=me.serve,
                pid=me.pid,
                started_at=now,
                seen_at=now,
                agents_held=agents_held,
                loops=sorted(loops),
            )
        )
        session.execute(delete(Replica).where(Replica.seen_at < now - FORGET_AFTER))
        return
    row.seen_at = now
    row.stopped_at = None
    row.agents_held = agents_held
    if (row.http_address, row.grpc_address) != (me.http_address, me.grpc_address):
        row.http_address, row.grpc_address = me.http_address, me.grpc_address
    if sorted(row.loops or []) != sorted(loops):
        row.loops = sorted(loops)


def stop(session: Session, me: ReplicaIdentity, now: datetime | None = None) -> None:
    """A clean stop: the replica is gone at once (no timeout to wait), and so are the streams it held;
    their agents move to another replica with the grace of a replica's death (`silence_verdict`)."""
    now = now or utcnow()
    session.execute(
        update(Replica).where(Replica.id == me.id).values(stopped_at=now, agents_held=0, loops=[])
    )


def alive_cutoff(now: datetime) -> datetime:
    return now - timedelta(seconds=REPLICA_TIMEOUT_S)


def others_alive(session: Session, me: str, now: datetime | None = None) -> int:
    """How many other replicas are alive now: beating within REPLICA_FRESH_S and, where the database can
    tell (somebody listens), still connected to it. A start that finds none is the whole control plane
    starting, and its agents get time to reconnect (server/app.py).

    A replica killed a moment ago has a row that still reads alive for REPLICA_TIMEOUT_S; it must not count,
    or a coordinator restarted at once would give its agents no time at all. On SQLite there is none: one
    coordinator runs on it (server/db/single_instance.py), and this one holds the lock."""
    if session.get_bind().dialect.name != "postgresql":
        return 0
    now = now or utcnow()
    connected = connected_replicas(session)
    return int(
        session.scalar(
            select(func.count())
            .select_from(Replica)
            .where(Replica.id.in_(_fresh_replicas(me, now, connected or None)))
        )
        or 0
    )


def application_name(replica_id: str) -> str:
    """What a replica's listening connection calls itself in pg_stat_activity (server/live/agent_notify.py)."""
    return f"{APPLICATION_PREFIX}{replica_id}"


def connected_replicas(session: Session) -> frozenset[str]:
    """The replicas whose listening connection PostgreSQL holds now: a killed replica's ends with its
    process, before its beats have had time to age (empty on SQLite, or where nobody listens)."""
    if session.get_bind().dialect.name != "postgresql":
        return frozenset()
    names = session.scalars(
        text("SELECT application_name FROM pg_stat_activity WHERE application_name LIKE :prefix"),
        {"prefix": APPLICATION_PREFIX + "%"},
    ).all()
    return frozenset(name[len(APPLICATION_PREFIX) :] for name in names)


def _fresh_replicas(me: str, now: datetime, connected: frozenset[str] | None = None) -> ScalarSelect[str]:
    query = select(Replica.id).where(
        Replica.id != me,
        Replica.stopped_at.is_(None),
        Replica.seen_at >= now - timedelta(seconds=REPLICA_FRESH_S),
    )
    if connected is not None:
        query = query.where(Replica.id.in_(connected))
    return query.scalar_subquery()


def streams_elsewhere(session: Session, me: str, now: datetime | None = None) -> frozenset[str]:
    """Agents whose stream another replica holds, one beating now and, where this replica's own listening
    connection shows the database can tell, still connected to it: they take commands there (the
    scheduler's offer). A killed replica's agents are left out at once; they are on their way elsewhere."""
    now = now or utcnow()
    connected = connected_replicas(session)
    fresh = _fresh_replicas(me, now, connected if me in connected else None)
    return frozenset(
        session.scalars(
            select(Agent.id).where(Agent.stream_replica.in_(fresh), Agent.removed_at.is_(None))
        ).all()
    )


def name_streaming_elsewhere(
    session: Session, me: str, name: str, now: datetime | None = None
) -> frozenset[str]:
    """The id of the agent named `name` if another replica beating now holds its stream (a registration
    under that name from elsewhere is refused); one indexed row, whatever the number of agents."""
    now = now or utcnow()
    return frozenset(
        session.scalars(
            select(Agent.id).where(Agent.name == name, Agent.stream_replica.in_(_fresh_replicas(me, now)))
        ).all()
    )


def release_streams_of_the_dead(session: Session, grace_s: float, now: datetime | None = None) -> int:
    """The agents whose streams a replica that died held (its listening connection gone from PostgreSQL,
    or its beats stale, or a clean stop) are moving: each stays online `grace_s` more to say hello to
    another replica, and holds no stream until it does. Returns how many; a cheap read when none died.

    Run by the reconciler's leader every pass, so a moving agent never reads as offline or lost for as
    long as a failover takes."""
    now = now or utcnow()
    held = session.execute(
        select(Replica.id, Replica.stopped_at, Replica.seen_at).where(
            Replica.id.in_(select(Agent.stream_replica).where(Agent.stream_replica.is_not(None)).distinct())
        )
    ).all()
    connected = connected_replicas(session)
    listening = bool(connected)  # somebody listens: the database can tell who is connected
    stale = now - timedelta(seconds=REPLICA_FRESH_S)
    late = now - timedelta(seconds=MISSED_BEAT_S)
    # Killed: its connection is gone and it has missed a beat (a listener that only reconnects still beats).
    dead = [
        replica_id
        for replica_id, stopped_at, seen_at in held
        if stopped_at is not None
        or seen_at < stale
        or (listening and replica_id not in connected and seen_at < late)
    ]
    if not dead:
        return 0
    until = now + timedelta(seconds=grace_s)
    # Locked up front in id order, as liveness flushes take agents (they do not wait for the writer lock).
    moving = session.scalars(
        select(Agent).where(Agent.stream_replica.in_(dead)).order_by(Agent.id).with_for_update()
    ).all()
    for agent in moving:
        agent.stream_replica = None
        if agent.removed_at is None and agent.lost_at is None:
            agent.online_until = max(agent.online_until or now, until)
    return len(moving)


def silence_verdict(session: Session, agent: Agent, now: datetime | None = None) -> str:
    """What an agent's expired liveness means, judged from the replica holding its stream:

    - "moving": that replica stopped or stopped beating; the agent is on its way to another;
    - "wait": that replica beats, but has not written what it heard since the agent's liveness ran out
      (its flush waits for the writer lock): its silence is not known yet;
    - "lost": no replica holds its stream, or the one holding it wrote its liveness since and had not
      heard from it.
    """
    if agent.stream_replica is None:
        return "lost"
    now = now or utcnow()
    replica = session.get(Replica, agent.stream_replica)
    if replica is None or replica.stopped_at is not None:
        return "moving"
    if replica.seen_at < now - timedelta(seconds=REPLICA_FRESH_S):
        return "moving"
    if agent.online_until is not None and replica.seen_at <= agent.online_until:
        return "wait"
    return "lost"


def claim_stream(session: Session, agent_id: str, me: str) -> int:
    """Makes `me` the holder of the agent's stream, with a new epoch, which it returns."""
    agent = session.get(Agent, agent_id)
    if agent is None:
        return 0
    agent.stream_replica = me
    agent.stream_epoch = (agent.stream_epoch or 0) + 1
    return agent.stream_epoch


def release_stream(session: Session, agent_id: str, me: str, epoch: int) -> None:
    """The stream of `epoch` on `me` ended: the agent has none until its next hello, unless it has a newer."""
    session.execute(
        update(Agent)
        .where(Agent.id == agent_id, Agent.stream_replica == me, Agent.stream_epoch == epoch)
        .values(stream_replica=None)
    )


def list_replicas(session: Session, now: datetime | None = None) -> list[ReplicaView]:
    """Every replica on record, alive first, then newest first."""
    now = now or utcnow()
    cutoff = alive_cutoff(now)
    views = [
        ReplicaView(
            id=r.id,
            name=r.name,
            http_address=r.http_address,
            grpc_address=r.grpc_address,
            version=r.version,
            serve=r.serve,
            pid=r.pid,
            started_at=r.started_at,
            seen_at=r.seen_at,
            stopped_at=r.stopped_at,
            alive=r.stopped_at is None and r.seen_at >= cutoff,
            agents_held=r.agents_held if r.stopped_at is None and r.seen_at >= cutoff else 0,
            loops=list(r.loops or []),
        )
        for r in session.scalars(select(Replica)).all()
    ]
    views.sort(key=lambda v: (not v.alive, -v.started_at.timestamp()))
    return views

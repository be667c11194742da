"""SQLAlchemy models (server/db/models/): the agents' and the coordinator replicas' rows: registration, liveness, cordons, streams."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Integer,
    String,
    Text,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from mwms.server.db.models import Base, new_id, utcnow


class Agent(Base):
    __tablename__ = "agents"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    hostname: Mapped[str] = mapped_column(String(255))
    advertise_address: Mapped[str] = mapped_column(String(255))
    port_low: Mapped[int] = mapped_column(Integer)
    port_high: Mapped[int] = mapped_column(Integer)
    version: Mapped[str] = mapped_column(String(50), default="")
    # How the agent confines its tasks, as it says at registration (RegisterRequest.task_isolation).
    task_isolation: Mapped[str] = mapped_column(String(200), default="", server_default="")
    # [{"kind": "gpu"|"cpu", "index": int, "name": str, "uuid": str, "memory_mib": int}]
    devices: Mapped[list[Any]] = mapped_column(default=list)
    # Memory the agent offers its tasks in all (RegisterRequest.memory_bytes); 0: unknown (no memory check).
    memory_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # Its warm pool (worker_agent/warm_pool.py): interpreters it keeps (RegisterRequest.warm_pool_size), and
    # as its last heartbeat flushed said, how many are ready and the resident memory of those waiting.
    warm_pool_size: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    warm_pool_ready: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    warm_pool_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(default=None)
    # Liveness as data: the agent is online while now < online_until.
    online_until: Mapped[datetime | None] = mapped_column(default=None)
    # Set when the reconciler has acted on this agent being lost; cleared when it comes back.
    lost_at: Mapped[datetime | None] = mapped_column(default=None)
    # Set when the agent said goodbye (a clean stop, e.g. `systemctl stop`): it reads as stopped, not online
    # and never lost; cleared when it registers, says hello or is heard from on a later stream.
    stopped_at: Mapped[datetime | None] = mapped_column(default=None)
    # sha256 (hex) of the secret half of the credential issued at registration; None: none issued.
    credential_hash: Mapped[str | None] = mapped_column(String(64), default=None)
    # Set when an admin removed the agent: its credential is void until it joins again with a join token.
    removed_at: Mapped[datetime | None] = mapped_column(default=None)
    # Cordoned: no new placements (an admin's `mwms agent cordon`, or a drain); who, when and why.
    cordoned_at: Mapped[datetime | None] = mapped_column(default=None)
    cordoned_by: Mapped[str] = mapped_column(String(200), default="", server_default="")
    cordon_reason: Mapped[str] = mapped_column(Text, default="", server_default="")
    # Draining: cordoned, and the jobs it runs are preempted gracefully and placed elsewhere.
    draining: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # The coordinator replica holding the agent's stream, and the stream's epoch (one more at every hello):
    # commands are delivered only by that replica on that stream (server/services/fleet/replicas.py).
    stream_replica: Mapped[str | None] = mapped_column(String(32), default=None)
    stream_epoch: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class Replica(Base):
    """One coordinator process on this database: where it listens, what it serves, when it was last seen."""

    __tablename__ = "replicas"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(255))  # host:http port, or --replica-name
    http_address: Mapped[str] = mapped_column(String(300), default="")
    grpc_address: Mapped[str] = mapped_column(String(300), default="")
    version: Mapped[str] = mapped_column(String(50), default="")
    serve: Mapped[str] = mapped_column(String(10))  # "api", "agents" or "both"
    pid: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Written every beat (about a second); a replica not seen for REPLICA_TIMEOUT_S is gone.
    seen_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    stopped_at: Mapped[datetime | None] = mapped_column(default=None)
    agents_held: Mapped[int] = mapped_column(Integer, default=0)
    # The background loops this replica leads (server/live/pass_locks.py).
    loops: Mapped[list[Any]] = mapped_column(default=list)

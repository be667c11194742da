"""Agent liveness kept in memory between flushes: a heartbeat costs a dict write, not a transaction.

Every message on an agent's stream proves it alive (`seen`). The reconciler loop takes what was seen
(`take`) and writes it in one batched transaction (services.fleet.agents.record_heartbeats) right before it
derives who is lost, so the database stays the source of truth for the API, for placement and for a
coordinator restart (grant_reconnect_grace), and the lost decision never runs on stale liveness.
"""

from __future__ import annotations

from datetime import datetime

from mwms.agent_defaults import MAX_WARM_POOL
from mwms.server.db.models import utcnow

POOL_MEMORY_STEP = 16 * 1024**2
# More memory than any machine's: a heartbeat saying more is held to it.
MAX_POOL_BYTES = 1 << 50


class Liveness:
    """Last time each agent was heard from, since the last flush; used from the event loop only."""

    def __init__(self) -> None:
        self._seen: dict[str, datetime] = {}
        # Warm pools (agent id -> (ready, resident bytes)) said since the last flush, and as last written.
        self._pools: dict[str, tuple[int, int]] = {}
        self._written_pools: dict[str, tuple[int, int]] = {}

    def seen(self, agent_id: str, at: datetime | None = None) -> None:
        """Records that the agent was heard from now."""
        self._seen[agent_id] = at or utcnow()

    def take(self) -> dict[str, datetime]:
        """What was seen since the last take; the caller writes it or hands it back with `restore`."""
        seen, self._seen = self._seen, {}
        return seen

    def restore(self, seen: dict[str, datetime]) -> None:
        """Hands back a take whose write failed; newer sightings win."""
        for agent_id, at in seen.items():
            if agent_id not in self._seen or self._seen[agent_id] < at:
                self._seen[agent_id] = at

    def warm_pool(self, agent_id: str, ready: int, resident_bytes: int) -> None:
        """Records the agent's warm pool as a heartbeat said; written by the next flush when it changed
        (the memory in steps of POOL_MEMORY_STEP, so a pool that only breathes costs no write); what no
        pool can hold (a count over MAX_WARM_POOL, memory below 0 or over MAX_POOL_BYTES) is held to it."""
        ready = min(max(0, ready), MAX_WARM_POOL)
        resident = min(max(0, resident_bytes), MAX_POOL_BYTES)
        reading = (ready, resident // POOL_MEMORY_STEP * POOL_MEMORY_STEP)
        if self._written_pools.get(agent_id) != reading:
            self._pools[agent_id] = reading

    def take_pools(self) -> dict[str, tuple[int, int]]:
        """The warm pools to write; `restore_pools` hands them back when the write failed."""
        pools, self._pools = self._pools, {}
        self._written_pools.update(pools)
        return pools

    def restore_pools(self, pools: dict[str, tuple[int, int]]) -> None:
        for agent_id, reading in pools.items():
            self._written_pools.pop(agent_id, None)
            self._pools.setdefault(agent_id, reading)

    def __len__(self) -> int:
        return len(self._seen)

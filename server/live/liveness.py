"""Agent liveness kept in memory between flushes: a heartbeat costs a dict write, not a transaction.

Every message on an agent's stream proves it alive (`seen`). The reconciler loop takes what was seen
(`take`) and writes it in one batched transaction (services.fleet.agents.record_heartbeats) right before it
derives who is lost, so the database stays the source of truth for the API, for placement and for a
coordinator restart (grant_reconnect_grace), and the lost decision never runs on stale liveness.
"""

from __future__ import annotations

from datetime import datetime

from mwms.server.db.models import utcnow


class Liveness:
    """Last time each agent was heard from, since the last flush; used from the event loop only."""

    def __init__(self) -> None:
        self._seen: dict[str, datetime] = {}

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

    def __len__(self) -> int:
        return len(self._seen)

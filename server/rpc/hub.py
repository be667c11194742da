"""In-memory wake-ups for connected agent sessions; the database stays the source of truth."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


class AgentHub:
    """Knows which agents have a live session and wakes their dispatchers when work may be waiting.

    A session also ends itself when a wake-up finds its agent removed (AgentStream._dispatch): the removal
    is in the database, and the REST route wakes every session after it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._events: dict[str, asyncio.Event] = {}
        self._owners: dict[str, object] = {}

    def attach(self, agent_id: str, owner: object) -> asyncio.Event:
        """Registers a session as the agent's current one; returns its wake event."""
        self._owners[agent_id] = owner
        event = asyncio.Event()
        self._events[agent_id] = event
        return event

    def detach(self, agent_id: str, owner: object) -> None:
        if self._owners.get(agent_id) is owner:
            del self._owners[agent_id]
            del self._events[agent_id]

    def is_current(self, agent_id: str, owner: object) -> bool:
        return self._owners.get(agent_id) is owner

    def connected(self) -> set[str]:
        return set(self._owners)

    def wake(self, agent_ids: Iterable[str] | None = None) -> None:
        """Wakes the given agents' sessions (all when None); safe to call from any thread."""
        ids = list(agent_ids) if agent_ids is not None else None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._wake_now(ids)
        else:
            self._loop.call_soon_threadsafe(self._wake_now, ids)

    def _wake_now(self, ids: list[str] | None) -> None:
        for agent_id, event in self._events.items():
            if ids is None or agent_id in ids:
                event.set()

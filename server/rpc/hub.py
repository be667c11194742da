"""In-memory wake-ups for connected agent sessions; the database stays the source of truth."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Protocol


class Closable(Protocol):
    def close(self, reason: str) -> None: ...


class AgentHub:
    """Knows which agents have a live session, wakes their dispatchers when work may be waiting, and ends
    a session when its agent may no longer talk (removed by an admin)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._events: dict[str, asyncio.Event] = {}
        self._owners: dict[str, Closable] = {}

    def attach(self, agent_id: str, owner: Closable) -> asyncio.Event:
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
        self._call_in_loop(self._wake_now, ids)

    def close(self, agent_id: str, reason: str) -> None:
        """Ends the agent's live session, if any, telling it `reason`; safe to call from any thread."""
        self._call_in_loop(self._close_now, agent_id, reason)

    def _call_in_loop(self, fn: Callable[..., None], *args: object) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            fn(*args)
        else:
            self._loop.call_soon_threadsafe(fn, *args)

    def _wake_now(self, ids: list[str] | None) -> None:
        for agent_id, event in self._events.items():
            if ids is None or agent_id in ids:
                event.set()

    def _close_now(self, agent_id: str, reason: str) -> None:
        owner = self._owners.get(agent_id)
        if owner is not None:
            owner.close(reason)

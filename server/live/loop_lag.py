"""How late the coordinator's event loop runs what is due: the wait every heartbeat answer and REST call
shares, measured where it happens.

A timer is set every PROBE_INTERVAL_S; how late it fires (the loop was busy, or its process had no core)
goes to mwms_event_loop_lag_seconds. A heartbeat's round trip as the agent measures it
(mwms_heartbeat_round_trip_seconds) adds the network and the agent's own process; this is the coordinator's
part alone, so a slow round trip can be told apart from a slow coordinator.
"""

from __future__ import annotations

import asyncio
import contextlib

from mwms.server.observability.instruments import observe_loop_lag

# Ten timers a second: each costs the loop microseconds, and a stall of 100 ms or more is always seen.
PROBE_INTERVAL_S = 0.1


class LoopLagProbe:
    """Observes the event loop's lateness until stopped; started and stopped inside the running loop."""

    def __init__(self, interval_s: float = PROBE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.samples = 0  # observations made (tests)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            observe_loop_lag(max(0.0, loop.time() - due))
            self.samples += 1

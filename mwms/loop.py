"""One helper for every periodic or reconnecting loop: interval, jitter, exponential backoff, stop event."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass
class Backoff:
    """Exponential backoff with jitter: delays grow from `initial` to `maximum` and reset on success.

    Each delay is the current step moved randomly by up to `jitter` of itself (0.5: a step of 2 s gives
    1-3 s), so many clients that failed at the same moment (agents whose coordinator died) spread out.
    """

    initial: float = 0.5
    maximum: float = 30.0
    factor: float = 2.0
    jitter: float = 0.5  # fraction of the delay that is randomised
    _current: float = 0.0

    def next_delay(self) -> float:
        """The delay before the next try; each call grows the next one."""
        self._current = self.initial if self._current == 0 else min(self.maximum, self._current * self.factor)
        spread = self._current * self.jitter
        return max(0.0, self._current - spread + random.random() * spread * 2)

    def reset(self) -> None:
        self._current = 0.0


def with_jitter(interval: float, fraction: float = 0.1) -> float:
    """`interval` moved randomly by up to `fraction` of itself, so many loops do not beat in step."""
    return interval * (1 - fraction + 2 * fraction * random.random())


async def run_every_async(
    interval: float,
    body: Callable[[], Awaitable[None]],
    *,
    wake: asyncio.Event | None = None,
    logger: logging.Logger | None = None,
) -> None:
    """Awaits `body()` every `interval` seconds (sooner when `wake` is set) until cancelled.

    An exception is logged and followed by a backoff, so one bad pass never ends the loop.
    """
    backoff = Backoff(initial=interval, maximum=max(interval * 16, 5.0))
    while True:
        delay = with_jitter(interval)
        try:
            await body()
            backoff.reset()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the loop outlives any one failing pass
            (logger or logging.getLogger("mwms.loop")).exception("periodic task failed; retrying")
            delay = backoff.next_delay()
        if wake is None:
            await asyncio.sleep(delay)
            continue
        try:
            await asyncio.wait_for(wake.wait(), timeout=delay)
        except TimeoutError:
            pass
        wake.clear()

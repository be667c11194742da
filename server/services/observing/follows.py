"""Log follows: how many may be open at once (per user and in all), and when one ends.

A follow sends the lines that arrive after its cursor until the job has ended (plus a short grace for
the agents' last lines), its client goes away, or it has sent nothing for the idle timeout, so that a
job that never ends cannot hold a stream forever. Clients follow again from their last line's id.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from mwms.server.limits import TooManyRequests

# Empty polls after the job has ended before the follow ends: the agents' last lines may still be on
# their way.
POLLS_AFTER_END = 4


class HasId(Protocol):
    @property
    def id(self) -> int: ...


Line = TypeVar("Line", bound=HasId)


@dataclass
class FollowSlots:
    """Open follows, counted per user and in all (one event loop updates them: no lock)."""

    per_user: int
    total: int
    open_by_user: Counter[str] = field(default_factory=Counter)

    @property
    def open_total(self) -> int:
        return sum(self.open_by_user.values())

    def acquire(self, user: str) -> FollowSlot:
        """A slot for one more follow by `user`, or TooManyRequests naming the limit it would pass."""
        if self.open_by_user[user] >= self.per_user:
            raise TooManyRequests(
                f"{user!r} already follows {self.open_by_user[user]} log streams, the most one user may "
                f"(MWMS_MAX_FOLLOWS_PER_USER={self.per_user}): close one, or read pages with ?after= instead"
            )
        if self.open_total >= self.total:
            raise TooManyRequests(
                f"the coordinator already serves {self.open_total} log follows, the most it allows "
                f"(MWMS_MAX_FOLLOWS_TOTAL={self.total}): try again later, or read pages with ?after= instead"
            )
        self.open_by_user[user] += 1
        return FollowSlot(self, user)

    def _release(self, user: str) -> None:
        self.open_by_user[user] -= 1
        if self.open_by_user[user] <= 0:
            del self.open_by_user[user]


@dataclass
class FollowSlot:
    slots: FollowSlots
    user: str
    released: bool = False

    def release(self) -> None:
        """Frees the slot; later calls do nothing."""
        if not self.released:
            self.released = True
            self.slots._release(self.user)


async def follow_lines(
    read: Callable[[int], Awaitable[tuple[Sequence[Line], bool]]],
    cursor: int,
    client_gone: Callable[[], Awaitable[bool]],
    *,
    idle_timeout_s: float,
    poll_interval_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[Sequence[Line]]:
    """Batches of lines newer than `cursor` until the job has ended, the client is gone or it idled out.

    `read(cursor)` returns the lines after `cursor` and whether the job has ended.
    """
    last_sent = clock()
    ended_polls = 0
    while not await client_gone():
        batch, ended = await read(cursor)
        if batch:
            cursor = batch[-1].id
            last_sent = clock()
            ended_polls = 0
            yield batch
            continue
        ended_polls = ended_polls + 1 if ended else 0
        if ended_polls >= POLLS_AFTER_END or clock() - last_sent >= idle_timeout_s:
            return
        await asyncio.sleep(poll_interval_s)

"""Handing a grouped transaction's outcomes back to the streams that queued its items (server/live/ingest.py,
server/live/hello_writer.py): each waits on a future of its own, and one that ended meanwhile is skipped."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any


def settle(futures: Sequence[asyncio.Future[Any]], outcomes: Sequence[object]) -> None:
    """Resolves each future with its outcome: a result, or the exception that item alone raised."""
    for future, outcome in zip(futures, outcomes, strict=True):
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


def fail(futures: Iterable[asyncio.Future[Any]], error: BaseException) -> None:
    """The whole transaction failed: every waiting future gets `error` (each stream decides what it means)."""
    for future in futures:
        if not future.done():
            future.set_exception(error)


def cancel(futures: Iterable[asyncio.Future[Any]]) -> None:
    for future in futures:
        future.cancel()

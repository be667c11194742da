"""The one SQL statement counter of the tests: what a block of code sent to a database, as statements.

Tests that hold a query count (no statement per row, per agent, per job) record with `recorded`; a
predicate keeps only the statements a test is about (SELECTs, UPDATE agents, ...), and `threads` only
those sent from threads whose name starts with a prefix (AnyIO's request workers, say).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine


def selects(statement: str) -> bool:
    return statement.lstrip().upper().startswith("SELECT")


def starting(*prefixes: str) -> Callable[[str], bool]:
    """A predicate: statements that start with one of `prefixes` (case and leading spaces aside)."""
    wanted = tuple(prefix.upper() for prefix in prefixes)
    return lambda statement: statement.lstrip().upper().startswith(wanted)


@contextmanager
def recorded(
    engine: Engine, where: Callable[[str], bool] | None = None, *, threads: str | None = None
) -> Iterator[list[str]]:
    """The statements sent on `engine` while the block runs (those `where` keeps), in order."""
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if threads is not None and not threading.current_thread().name.startswith(threads):
            return
        if where is None or where(statement):
            statements.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", record)

"""JSON columns read as their text and parsed once per distinct value, for the scheduler's hot reads.

A pass reads every agent's devices and every device-holding task's indices: thousands of small JSON
values, most of them alike (`[{"kind": "cpu", "index": 0, ...}]`, `[0]`). SQLAlchemy's JSON type parses
each one again on every read; reading the text (`as_text`) and parsing it through `parsed` keeps one
parsed value per distinct text. The values returned are shared between callers: read them, never change
them. The text is cast in SQL, so a driver that parses JSON itself (psycopg) hands back text too: on
PostgreSQL a quiet pass parsed ~2,900 JSON values and wrote each back as text for its memo key (35 of its
~52 ms).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from sqlalchemy import Text, cast
from sqlalchemy.sql.elements import ColumnElement

DISTINCT_VALUES = 4096


def as_text(column: Any) -> ColumnElement[str]:
    """The column's JSON text, cast by the database (no parsing by the driver or by SQLAlchemy)."""
    return cast(column, Text)


@lru_cache(maxsize=DISTINCT_VALUES)
def _parse(text: str) -> Any:
    return json.loads(text)


def parsed(value: Any) -> Any:
    """A JSON column's value read with `as_text`: parsed once per distinct text (shared: read only)."""
    return _parse(value) if isinstance(value, str) else value


def hashable(value: Any) -> Any:
    """A JSON column's value read with `as_text`, as a key for a memo: its text, or (from a driver that
    parses JSON itself) the value's canonical text."""
    return value if isinstance(value, str) or value is None else json.dumps(value, sort_keys=True)

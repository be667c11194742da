"""How a batch of log lines or metric points reaches the database driver: the statements each dialect runs and
the per-column conversions of its values, built once per table and columns from the table itself.

On SQLite one INSERT ... ON CONFLICT DO NOTHING that the driver runs once per row (insert_plan); on PostgreSQL
a staging table, a binary COPY into it and one INSERT ... SELECT ... ON CONFLICT DO NOTHING (copy_plan).
services/observing/telemetry.py runs them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Dialect, Table, UniqueConstraint
from sqlalchemy.engine.processors import to_float

_FLOAT_OR_NONE = frozenset({float, type(None)})


class Bind:
    """A table's columns as the database driver takes them: each row's values through the column types'
    bind processors for the dialect, as SQLAlchemy's own execution would (a timestamp as SQLite's text, for
    one). Processed values are remembered within a call (a batch's rows share a handful of times), but
    for floats, where equal values can differ (0.0 and -0.0). A float column's processor (SQLAlchemy's
    `to_float`) gives back a float or None as it is: it runs only for a batch where that column holds
    anything else, so a metric point's value costs no call (1 of the ~8 us a point cost the ingest process)."""

    def __init__(self, table: Table, columns: tuple[str, ...], dialect: Dialect) -> None:
        every = tuple(
            (i, process)
            for i, name in enumerate(columns)
            if (process := table.columns[name].type.dialect_impl(dialect).bind_processor(dialect)) is not None
        )
        self._every = every
        self._floats = tuple(i for i, process in every if process is to_float)
        self.processors = tuple((i, process) for i, process in every if process is not to_float)

    def rows(self, rows: list[tuple]) -> list[tuple]:
        processors = self.processors
        for i in self._floats:
            if not {type(row[i]) for row in rows} <= _FLOAT_OR_NONE:
                processors = self._every
                break
        if not processors:
            return rows
        if len(processors) == 1 and rows and type(rows[0][processors[0][0]]) is not float:
            return self._one_column(rows, processors[0])
        remembered: list[dict[Any, Any]] = [{} for _ in processors]
        bound = []
        for row in rows:
            values = list(row)
            for (i, process), memo in zip(processors, remembered, strict=True):
                value = values[i]
                if type(value) is float:
                    values[i] = process(value)
                    continue
                try:
                    values[i] = memo[value]
                except KeyError:
                    values[i] = memo[value] = process(value)
            bound.append(tuple(values))
        return bound

    @staticmethod
    def _one_column(rows: list[tuple], processor: tuple[int, Any]) -> list[tuple]:
        """The same for the one processed column (a timestamp), in fewer steps: most batches."""
        i, process = processor
        memo: dict[Any, Any] = {}
        bound = []
        for row in rows:
            value = row[i]
            done = memo.get(value)
            if done is None:
                done = memo[value] = process(value)
            bound.append((*row[:i], done, *row[i + 1 :]))
        return bound


@dataclass(frozen=True)
class InsertPlan:
    """One executemany of `table` rows holding `columns`, skipping rows stored before (see insert_plan)."""

    columns: tuple[str, ...]
    sql: str  # positional parameters in the order of `columns` (SQLite), else ""
    bind: Bind


@functools.cache
def insert_plan(table: Table, columns: tuple[str, ...], dialect: Dialect) -> InsertPlan:
    """On SQLite, the INSERT ... ON CONFLICT DO NOTHING that the driver runs once per row of a batch with
    values bound here: SQLAlchemy's own executemany built a dict and ran every type's processor per row,
    which cost more than SQLite's insert itself (bench/README.md, ingest). Names come from the table."""
    sql = ""
    if dialect.name == "sqlite":
        quote = dialect.identifier_preparer.quote
        names = ", ".join(quote(name) for name in columns)
        marks = ", ".join("?" for _ in columns)
        sql = f"INSERT INTO {quote(table.name)} ({names}) VALUES ({marks}) ON CONFLICT DO NOTHING"
    return InsertPlan(columns=columns, sql=sql, bind=Bind(table, columns, dialect))


@dataclass(frozen=True)
class CopyPlan:
    """The statements and per-column conversions that COPY a batch of `table` rows (see copy_plan)."""

    columns: tuple[str, ...]
    create: str
    copy: str
    move: str
    bind: Bind


@functools.cache
def copy_plan(table: Table, columns: tuple[str, ...], dialect: Dialect) -> CopyPlan:
    """How to COPY rows holding `columns` into `table`: every name and type comes from the table itself.

    The staging table is created in the transaction, ON COMMIT DROP, rather than kept by the connection
    with ON COMMIT DELETE ROWS: nothing of it outlives the transaction, neither rows nor a table that a
    pooler (PgBouncer in transaction mode) would hand to other clients or that would predate a migration
    of the table it copies into. It costs 0.5-1 ms a transaction (creating it 0.3 ms, dropping it at
    commit the rest; bench/pg_insert_ways.py), against the writer's transactions of about a second, and
    no difference in rows/s with 500-row batches. Each batch empties it as it moves the rows (DELETE ...
    RETURNING), so the batches of one transaction never see each other's rows; a savepoint rolled back
    takes its rows with it.
    """
    quote = dialect.identifier_preparer.quote
    names = ", ".join(quote(name) for name in columns)
    staged = quote(f"mwms_staged_{table.name}")
    (unique,) = [c for c in table.constraints if isinstance(c, UniqueConstraint)]
    key = ", ".join(quote(c.name) for c in unique.columns)
    return CopyPlan(
        columns=columns,
        create=(
            f"CREATE TEMPORARY TABLE IF NOT EXISTS {staged} ON COMMIT DROP AS "
            f"SELECT {names} FROM {quote(table.name)} WITH NO DATA"
        ),
        copy=f"COPY {staged} ({names}) FROM STDIN (FORMAT BINARY)",
        # Ordered by the unique key: two replicas storing overlapping resends wait for each other's
        # rows in the same order, whatever order the batches came in, so they cannot deadlock.
        move=(
            f"WITH moved AS (DELETE FROM {staged} RETURNING {names}) "
            f"INSERT INTO {quote(table.name)} ({names}) SELECT {names} FROM moved ORDER BY {key} "
            f"ON CONFLICT ({key}) DO NOTHING"
        ),
        bind=Bind(table, columns, dialect),
    )

"""Log lines and metric points from agents: stored once per (task, seq), read back for users.

A batch is stored as far as it can be: a line or point that breaks the contract (mwms.metrics_line's
bounds, a seq or time the database cannot hold) is refused with a reason, and a row the database refuses
anyway is found by storing the batch row by row; both are counted, and the rest of the batch is stored.
Only a database that cannot be written at all (OperationalError) fails the batch, so the agent resends it.

A log line that redraws an earlier one (`replaces_seq`, a `\\r` progress bar) marks that one superseded: the
newest lines of a page and a failure reason leave it out (services/observing/log_pages.py,
services/job_life/failure_reasons.py).

Metric values: NaN is stored as NULL (SQLite turns NaN into NULL anyway), +-Infinity as they are.

On PostgreSQL a batch is COPYed into a staging table and moved with one INSERT ... SELECT ... ON CONFLICT DO
NOTHING (_copy_ignoring_duplicates); elsewhere, and for the row-by-row retry, it is one executemany. The
statements each dialect runs are built in services/observing/insert_plans.py.

Reading them back (log lines, metric pages, a job's progress) is services/observing/telemetry_reads.py, whose
names are importable from here too.
"""

from __future__ import annotations

import logging
import math
import struct
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import NamedTuple

from sqlalchemy import Table, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session

from mwms import metrics_line
from mwms.server.db.models import LogLine, MetricPoint, Task
from mwms.server.poison import count_poison, is_transient
from mwms.server.services.observing.insert_plans import copy_plan, insert_plan
from mwms.server.services.observing.telemetry_reads import (
    MAX_METRIC_POINTS_PER_PAGE as MAX_METRIC_POINTS_PER_PAGE,
)
from mwms.server.services.observing.telemetry_reads import Progress as Progress
from mwms.server.services.observing.telemetry_reads import ProgressColumns as ProgressColumns
from mwms.server.services.observing.telemetry_reads import latest_progress as latest_progress
from mwms.server.services.observing.telemetry_reads import progress_columns as progress_columns
from mwms.server.services.observing.telemetry_reads import progress_out as progress_out
from mwms.server.services.observing.telemetry_reads import read_logs as read_logs
from mwms.server.services.observing.telemetry_reads import read_metrics as read_metrics
from mwms.server.services.observing.telemetry_reads import value_out as value_out

log = logging.getLogger("mwms.server.telemetry")

# The seq columns are 32-bit integers on PostgreSQL.
MAX_SEQ = 2**31 - 1
MAX_UNIX_MS = int(metrics_line.MAX_TIME * 1000)
STREAMS = ("stdout", "stderr")


class IncomingLine(NamedTuple):
    """A log line as an agent sent it (a tuple: the ingest process makes 100,000 of these a second)."""

    seq: int
    stream: str
    text: str
    unix_ms: int
    # > 0: a newer state of the line with that seq (a `\r` redraw), which it replaces.
    replaces_seq: int = 0


class IncomingPoint(NamedTuple):
    """A metric point as an agent sent it."""

    seq: int
    name: str
    step: int
    value: float
    unix_ms: int


@dataclass
class StoreOutcome:
    """What became of a batch: the seq to acknowledge, and how many items were refused and why."""

    acked_seq: int = 0
    rejected: int = 0
    reason: str = ""
    nan_points: list[IncomingPoint] = field(default_factory=list)  # stored points whose value is NaN
    changed: bool = False  # a job's state changed because of the batch (restart.fail_on_nan)

    def refuse(self, seq: int, reason: str) -> None:
        self.rejected += 1
        if not self.reason:
            self.reason = f"seq {seq}: {reason}"
        elif self.rejected == 2:
            self.reason += " (and more)"


def _from_ms(unix_ms: int) -> datetime:
    return datetime.fromtimestamp(unix_ms / 1000, tz=timezone.utc)


def _seq_and_time_problem(seq: int, unix_ms: int) -> str | None:
    if not 1 <= seq <= MAX_SEQ:
        return f"seq {seq} is outside [1, {MAX_SEQ}]"
    if not 0 <= unix_ms <= MAX_UNIX_MS:
        return f"time {unix_ms} ms is outside [0, {MAX_UNIX_MS}] unix milliseconds"
    return None


def point_problem(point: IncomingPoint) -> str | None:
    """Why the coordinator refuses `point`, or None (the metrics line's bounds, plus the database's)."""
    return _seq_and_time_problem(point.seq, point.unix_ms) or metrics_line.point_problem(
        point.name, point.step, point.unix_ms / 1000
    )


def line_problem(line: IncomingLine) -> str | None:
    """Why the coordinator refuses a log line, or None."""
    return _seq_and_time_problem(line.seq, line.unix_ms)


def stored_value(value: float) -> float | None:
    """A metric value as the database keeps it: NaN as NULL."""
    return None if math.isnan(value) else value


def _short(error: BaseException) -> str:
    """What went wrong, without the SQL statement or its parameters."""
    cause = getattr(error, "orig", None) or error
    text = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    return f"{type(cause).__name__}: {text[:160]}" if text else type(cause).__name__


# Batches this long or longer go through COPY on PostgreSQL, shorter ones through one executemany: from 1 to
# 32 rows the two store as fast (bench/pg_copy_ingest.py, within its noise), and the executemany is one round
# trip where COPY takes three, so the row-by-row retry of _insert_contained stays what it was.
COPY_MIN_ROWS = 8
# The columns each store fills, in the order of its rows' values (tuples: no dict per line or point).
# `superseded` takes its server default (false).
LOG_COLUMNS = ("job_id", "task_id", "seq", "stream", "text", "at", "replaces_seq")
METRIC_COLUMNS = ("job_id", "task_id", "attempt", "seq", "name", "step", "value", "wall_time")


def _insert_ignoring_duplicates(
    session: Session, model: type, columns: tuple[str, ...], rows: list[tuple]
) -> None:
    """Inserts `rows` (values in the order of `columns`) in the session's transaction, skipping rows whose
    (task_id, seq) is stored already."""
    if not rows:
        return
    table: Table = model.__table__  # type: ignore[attr-defined]
    dialect = session.get_bind().dialect
    if dialect.name == "postgresql" and len(rows) >= COPY_MIN_ROWS:
        _copy_ignoring_duplicates(session, table, columns, rows)
        return
    plan = insert_plan(table, columns, dialect)
    if plan.sql:
        session.connection().exec_driver_sql(plan.sql, plan.bind.rows(rows))
        return
    insert = pg_insert if dialect.name == "postgresql" else sqlite_insert
    # One executemany of a compiled statement: compiling a multi-row VALUES costs more than the insert.
    session.connection().execute(
        insert(table).on_conflict_do_nothing(), [dict(zip(columns, row, strict=True)) for row in rows]
    )


# Binary COPY needs each column's type: its oid, read once per table and columns (built-in types, whose oids
# are the same on every server).
_COLUMN_TYPES = (
    "SELECT a.atttypid FROM unnest(%s::text[]) WITH ORDINALITY AS c(name, i) "
    "JOIN pg_attribute a ON a.attrelid = %s::regclass AND a.attname = c.name ORDER BY c.i"
)
_copy_types: dict[tuple[str, tuple[str, ...]], list[int]] = {}


def _copy_ignoring_duplicates(
    session: Session, table: Table, columns: tuple[str, ...], rows: list[tuple]
) -> None:
    """Stores `rows` in `table` in the session's transaction: COPY (binary) into a temporary table, then one
    INSERT ... SELECT ... ON CONFLICT DO NOTHING, so rows stored before, or twice in the batch, are skipped.

    bench/pg_copy_ingest.py, 500-item batches: 1.7-1.9x the points/s and 1.6x the lines/s of the
    executemany. Which of two rows with one seq in a batch is kept is not defined (agents never send that).
    """
    dialect = session.get_bind().dialect
    plan = copy_plan(table, columns, dialect)
    driver = session.connection().connection.driver_connection
    assert driver is not None
    try:
        with driver.cursor() as cursor:
            types = _copy_types.get((table.name, plan.columns))
            if types is None:
                cursor.execute(_COLUMN_TYPES, (list(plan.columns), table.name))
                types = _copy_types[(table.name, plan.columns)] = [oid for (oid,) in cursor.fetchall()]
            cursor.execute(plan.create)
            with cursor.copy(plan.copy) as copy:
                copy.set_types(types)
                for row in plan.bind.rows(rows):
                    copy.write_row(row)
            cursor.execute(plan.move)
    except dialect.loaded_dbapi.Error as error:
        # As SQLAlchemy would have raised it: _insert_contained and is_transient know its classes.
        raise DBAPIError.instance(plan.copy, None, error, dialect.loaded_dbapi.Error) from error
    except struct.error as error:  # a binary dumper's number out of its column's range
        raise OverflowError(f"a value does not fit its column: {error}") from error


def _insert_contained(
    session: Session,
    model: type,
    columns: tuple[str, ...],
    rows: list[tuple],
    outcome: StoreOutcome,
    kind: str,
) -> None:
    """Inserts `rows`; when the database refuses the batch, row by row, refusing only the rows it refuses.

    On PostgreSQL a refused statement aborts the transaction, so each try runs in a savepoint. SQLite backs
    out only the refused statement (a row of the executemany) and keeps the rows before it, which the retry
    then skips as stored: no savepoint there, whose cost per batch was more than a batch's inserts.
    """
    if not rows:
        return
    contained = session.begin_nested if session.get_bind().dialect.name != "sqlite" else nullcontext
    try:
        with contained():
            _insert_ignoring_duplicates(session, model, columns, rows)
        return
    except (SQLAlchemyError, ValueError, TypeError, OverflowError) as error:
        if is_transient(error):
            raise
        log.warning("the database refused a %s batch (%s); storing it row by row", kind, _short(error))
    seq = columns.index("seq")
    for row in rows:
        try:
            with contained():
                _insert_ignoring_duplicates(session, model, columns, [row])
        except (SQLAlchemyError, ValueError, TypeError, OverflowError) as error:
            if is_transient(error):
                raise
            count_poison(kind)
            outcome.refuse(row[seq], f"the database refused it ({_short(error)})")


class _Times:
    """Unix milliseconds as the datetimes stored, one object per distinct time of a batch."""

    def __init__(self) -> None:
        self._seen: dict[int, datetime] = {}

    def at(self, unix_ms: int) -> datetime:
        moment = self._seen.get(unix_ms)
        if moment is None:
            moment = self._seen[unix_ms] = _from_ms(unix_ms)
        return moment


def store_log_lines(session: Session, task: Task, lines: list[IncomingLine]) -> StoreOutcome:
    """Stores lines not stored before; all of them are acknowledged, the refused ones with a reason."""
    outcome = StoreOutcome(acked_seq=max((line.seq for line in lines), default=0))
    rows: list[tuple] = []
    times = _Times()
    job_id, task_id = task.job_id, task.id
    for line in lines:
        seq, unix_ms, stream, replaces = line.seq, line.unix_ms, line.stream, line.replaces_seq
        # The bounds of line_problem, checked inline: the function says why when one is broken.
        if not (1 <= seq <= MAX_SEQ and 0 <= unix_ms <= MAX_UNIX_MS):
            problem = line_problem(line)
            if problem:
                count_poison("log_line")
                outcome.refuse(seq, problem)
                continue
        rows.append(
            (
                job_id,
                task_id,
                seq,
                stream if stream in STREAMS else stream[:10],
                # PostgreSQL text cannot hold NUL; a program that prints one keeps the rest of its line.
                line.text.replace("\x00", "\ufffd"),
                times.at(unix_ms),
                # A redraw replaces an earlier line; one naming itself or a later line is a line of its own.
                replaces if 0 < replaces < seq else None,
            )
        )
    _insert_contained(session, LogLine, LOG_COLUMNS, rows, outcome, "log_line")
    _supersede_redrawn(session, task, [row[2] for row in rows if row[6] is not None])
    if outcome.rejected:
        log.warning("task %s: refused %d log line(s): %s", task.id, outcome.rejected, outcome.reason)
    return outcome


def _supersede_redrawn(session: Session, task: Task, redraw_seqs: list[int]) -> None:
    """Marks superseded the lines that the stored redraws among `redraw_seqs` replace (one UPDATE).

    Read from the stored rows, so a redraw the database refused replaces nothing, and a resent batch
    (failover) marks the same lines again.
    """
    if not redraw_seqs:
        return
    replaced = select(LogLine.replaces_seq).where(
        LogLine.task_id == task.id, LogLine.seq.in_(redraw_seqs), LogLine.replaces_seq.is_not(None)
    )
    session.execute(
        update(LogLine)
        .where(LogLine.task_id == task.id, LogLine.seq.in_(replaced.scalar_subquery()))
        .values(superseded=True)
        .execution_options(synchronize_session=False)
    )


def store_metric_points(session: Session, task: Task, points: list[IncomingPoint]) -> StoreOutcome:
    """Stores points not stored before; all of them are acknowledged, the refused ones with a reason."""
    outcome = StoreOutcome(acked_seq=max((p.seq for p in points), default=0))
    rows: list[tuple] = []
    times = _Times()
    names: dict[str, bool] = {}  # name -> within metrics_line's bounds (a batch repeats a few names)
    job_id, task_id, attempt = task.job_id, task.id, task.attempt_number
    for p in points:
        seq, name, step, unix_ms, value = p.seq, p.name, p.step, p.unix_ms, p.value
        fine = names.get(name)
        if fine is None:
            fine = names[name] = metrics_line.name_problem(name) is None
        # The bounds of point_problem, checked inline (a time within them is a finite time within the
        # metrics line's): the function says why when one is broken.
        if not (
            fine
            and 1 <= seq <= MAX_SEQ
            and 0 <= unix_ms <= MAX_UNIX_MS
            and metrics_line.MIN_STEP <= step <= metrics_line.MAX_STEP
        ):
            problem = point_problem(p)
            if problem:
                count_poison("metric_point")
                outcome.refuse(seq, problem)
                continue
        nan = math.isnan(value)
        rows.append((job_id, task_id, attempt, seq, name, step, None if nan else value, times.at(unix_ms)))
        if nan:
            outcome.nan_points.append(p)
    _insert_contained(session, MetricPoint, METRIC_COLUMNS, rows, outcome, "metric_point")
    if outcome.rejected:
        log.warning("task %s: refused %d metric point(s): %s", task.id, outcome.rejected, outcome.reason)
    return outcome

"""Log lines and metric points from agents: stored once per (task, seq), read back for users.

A batch is stored as far as it can be: a line or point that breaks the contract (mwms.metrics_line's
bounds, a seq or time the database cannot hold) is refused with a reason, and a row the database refuses
anyway is found by storing the batch row by row; both are counted, and the rest of the batch is stored.
Only a database that cannot be written at all (OperationalError) fails the batch, so the agent resends it.

A log line that redraws an earlier one (`replaces_seq`, a `\\r` progress bar) marks that one superseded: the
newest lines of a page and a failure reason leave it out (services/observing/log_pages.py, services/job_life/lifecycle.py).

Metric values: NaN is stored as NULL (SQLite turns NaN into NULL anyway), +-Infinity as they are.

On PostgreSQL a batch is COPYed into a staging table and moved with one INSERT ... SELECT ... ON CONFLICT DO
NOTHING (_copy_ignoring_duplicates); elsewhere, and for the row-by-row retry, it is one executemany.
"""

from __future__ import annotations

import functools
import logging
import math
import struct
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, Dialect, ScalarSelect, Table, UniqueConstraint, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import InstrumentedAttribute, Session, aliased

from mwms import metrics_line
from mwms.server.db.models import Job, LogLine, MetricPoint, Task
from mwms.server.poison import count_poison, is_transient

log = logging.getLogger("mwms.server.telemetry")

# The seq columns are 32-bit integers on PostgreSQL.
MAX_SEQ = 2**31 - 1
MAX_UNIX_MS = int(metrics_line.MAX_TIME * 1000)
STREAMS = ("stdout", "stderr")
# Metric points one read returns at most (GET /jobs/{id}/metrics pages beyond it).
MAX_METRIC_POINTS_PER_PAGE = 10_000


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


def value_out(stored: float | None) -> float | metrics_line.NonFinite:
    """A stored metric value as the API shows it: a number, or "NaN" / "Infinity" / "-Infinity"."""
    return metrics_line.json_value(math.nan if stored is None else stored)


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


class _Bind:
    """A table's columns as the database driver takes them: each row's values through the column types'
    bind processors for the dialect, as SQLAlchemy's own execution would (a timestamp as SQLite's text, for
    one). Processed values are remembered within a call (a batch's rows share a handful of times), but
    for floats, where equal values can differ (0.0 and -0.0)."""

    def __init__(self, table: Table, columns: tuple[str, ...], dialect: Dialect) -> None:
        self.processors = tuple(
            (i, process)
            for i, name in enumerate(columns)
            if (process := table.columns[name].type.dialect_impl(dialect).bind_processor(dialect)) is not None
        )

    def rows(self, rows: list[tuple]) -> list[tuple]:
        if not self.processors:
            return rows
        if len(self.processors) == 1 and rows and type(rows[0][self.processors[0][0]]) is not float:
            return self._one_column(rows)
        remembered: list[dict[Any, Any]] = [{} for _ in self.processors]
        bound = []
        for row in rows:
            values = list(row)
            for (i, process), memo in zip(self.processors, remembered, strict=True):
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

    def _one_column(self, rows: list[tuple]) -> list[tuple]:
        """The same for the one processed column (a timestamp), in fewer steps: most batches."""
        ((i, process),) = self.processors
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
class _InsertPlan:
    """One executemany of `table` rows holding `columns`, skipping rows stored before (see _insert_plan)."""

    columns: tuple[str, ...]
    sql: str  # positional parameters in the order of `columns` (SQLite), else ""
    bind: _Bind


@functools.cache
def _insert_plan(table: Table, columns: tuple[str, ...], dialect: Dialect) -> _InsertPlan:
    """On SQLite, the INSERT ... ON CONFLICT DO NOTHING that the driver runs once per row of a batch with
    values bound here: SQLAlchemy's own executemany built a dict and ran every type's processor per row,
    which cost more than SQLite's insert itself (bench/README.md, ingest). Names come from the table."""
    sql = ""
    if dialect.name == "sqlite":
        quote = dialect.identifier_preparer.quote
        names = ", ".join(quote(name) for name in columns)
        marks = ", ".join("?" for _ in columns)
        sql = f"INSERT INTO {quote(table.name)} ({names}) VALUES ({marks}) ON CONFLICT DO NOTHING"
    return _InsertPlan(columns=columns, sql=sql, bind=_Bind(table, columns, dialect))


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
    plan = _insert_plan(table, columns, dialect)
    if plan.sql:
        session.connection().exec_driver_sql(plan.sql, plan.bind.rows(rows))
        return
    insert = pg_insert if dialect.name == "postgresql" else sqlite_insert
    # One executemany of a compiled statement: compiling a multi-row VALUES costs more than the insert.
    session.connection().execute(
        insert(table).on_conflict_do_nothing(), [dict(zip(columns, row, strict=True)) for row in rows]
    )


@dataclass(frozen=True)
class _CopyPlan:
    """The statements and per-column conversions that COPY a batch of `table` rows (see _copy_plan)."""

    columns: tuple[str, ...]
    create: str
    copy: str
    move: str
    bind: _Bind


@functools.cache
def _copy_plan(table: Table, columns: tuple[str, ...], dialect: Dialect) -> _CopyPlan:
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
    return _CopyPlan(
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
        bind=_Bind(table, columns, dialect),
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
    plan = _copy_plan(table, columns, dialect)
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


def read_logs(
    session: Session,
    job: Job,
    *,
    task_index: int | None,
    attempt: int | None,
    after: int,
    tail: int,
    superseded: bool = True,
) -> list[tuple[LogLine, Task]]:
    """Log lines of a job in arrival order; `after` is a cursor (line id), `tail` keeps the newest N;
    `superseded=False` leaves out the lines a newer state (a redraw) replaced."""
    query = select(LogLine, Task).join(Task, Task.id == LogLine.task_id).where(LogLine.job_id == job.id)
    if not superseded:
        query = query.where(LogLine.superseded.is_(False))
    if task_index is not None:
        query = query.where(Task.index == task_index)
    if attempt is not None:
        query = query.where(Task.attempt_number == attempt)
    if after:
        query = query.where(LogLine.id > after)
        rows = session.execute(query.order_by(LogLine.id).limit(tail)).all()
        return [(line, task) for line, task in rows]
    rows = session.execute(query.order_by(LogLine.id.desc()).limit(tail)).all()
    return [(line, task) for line, task in reversed(rows)]


def read_metrics(
    session: Session,
    job: Job,
    *,
    name: str | None,
    min_step: int | None,
    max_step: int | None,
    attempt: int | None,
    after: int | None = None,
    limit: int = MAX_METRIC_POINTS_PER_PAGE,
) -> tuple[list[MetricPoint], bool]:
    """A page of a job's metric points and whether more match: at most `limit`, ordered by name,
    attempt and step; or, `after` a cursor (a point's id), only the points stored after it, in storage
    order, so a page that polls reads only what is new."""
    query = select(MetricPoint).where(MetricPoint.job_id == job.id)
    if after is not None:
        query = query.where(MetricPoint.id > after)
    if name:
        query = query.where(MetricPoint.name == name)
    if min_step is not None:
        query = query.where(MetricPoint.step >= min_step)
    if max_step is not None:
        query = query.where(MetricPoint.step <= max_step)
    if attempt is not None:
        query = query.where(MetricPoint.attempt == attempt)
    order: tuple[Any, ...] = (MetricPoint.id,)
    if after is None:
        order = (MetricPoint.name, MetricPoint.attempt, MetricPoint.step, MetricPoint.id)
    points = list(session.scalars(query.order_by(*order).limit(limit + 1)).all())
    return points[:limit], len(points) > limit


@dataclass(frozen=True)
class ProgressColumns:
    """Correlated scalar subqueries for a job's progress, so a page of jobs reads it in its own query."""

    step: ScalarSelect[Any]
    loss_id: ScalarSelect[Any]
    loss_value: ScalarSelect[Any]

    def all(self) -> tuple[ScalarSelect[Any], ScalarSelect[Any], ScalarSelect[Any]]:
        return self.step, self.loss_id, self.loss_value


Progress = tuple[int | None, float | metrics_line.NonFinite | None]


def progress_columns(job_id: ColumnElement[str] | InstrumentedAttribute[str] | str) -> ProgressColumns:
    """(latest step, latest loss) of the job `job_id` (a value, or a column such as Job.id) as subqueries.

    Each is a seek on ix_metric_points_job_attempt_step: the newest attempt that reported anything is its
    max(attempt), the latest step the first non-epoch point walking back from its highest step.
    """
    reported = aliased(MetricPoint)
    # Nested subqueries correlate to the outer jobs row explicitly (auto-correlation reaches one level).
    newest = (
        select(func.max(reported.attempt))
        .where(reported.job_id == job_id)
        .correlate_except(reported)
        .scalar_subquery()
    )
    of_newest = (MetricPoint.job_id == job_id, MetricPoint.attempt == newest)
    step = (
        select(MetricPoint.step)
        .where(*of_newest, ~MetricPoint.name.startswith("epoch_"))
        .order_by(MetricPoint.step.desc())
        .limit(1)
        .correlate_except(MetricPoint)
        .scalar_subquery()
    )
    loss_id = (
        select(MetricPoint.id)
        .where(*of_newest, MetricPoint.name == "loss")
        .order_by(MetricPoint.step.desc(), MetricPoint.id.desc())
        .limit(1)
        .correlate_except(MetricPoint)
        .scalar_subquery()
    )
    # A NaN loss is stored as NULL: the id tells "no loss reported" from "the loss was NaN".
    loss_point = aliased(MetricPoint)
    loss_value = (
        select(loss_point.value)
        .where(loss_point.id == loss_id)
        .correlate_except(loss_point)
        .scalar_subquery()
    )
    return ProgressColumns(step, loss_id, loss_value)


def progress_out(step: int | None, loss_id: int | None, loss_value: float | None) -> Progress:
    """The values of `progress_columns` as the API shows them (the loss through `value_out`)."""
    return step, (value_out(loss_value) if loss_id is not None else None)


def latest_progress(session: Session, job: Job) -> Progress:
    """(latest step, latest loss) reported by the job's newest attempt that reported anything.

    The loss is as the API shows it (`value_out`): a number or "NaN"/"Infinity"/"-Infinity"; None when
    no loss was reported. One query.
    """
    step, loss_id, loss_value = session.execute(select(*progress_columns(job.id).all())).one()
    return progress_out(step, loss_id, loss_value)

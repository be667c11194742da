"""How telemetry rows reach the SQLite driver (server/services/observing/insert_plans.py's Bind): as
SQLAlchemy's own execution would bind them, with the float column's processor skipped where it would
give the value back unchanged."""

from __future__ import annotations

import math
import sqlite3
from datetime import datetime, timezone

from sqlalchemy.dialects import sqlite

from mwms.server.db.models import LogLine, MetricPoint
from mwms.server.services.observing.insert_plans import insert_plan
from mwms.server.services.observing.telemetry import LOG_COLUMNS, METRIC_COLUMNS

AT = datetime(2026, 12, 6, 20, 45, 1, 250000, tzinfo=timezone.utc)


def _point(seq: int, value: object) -> tuple:
    return ("job", "task", 1, seq, "loss", seq, value, AT)


def _metric_bind():
    return insert_plan(MetricPoint.__table__, METRIC_COLUMNS, sqlite.dialect()).bind


def test_float_values_pass_as_they_are_and_the_time_becomes_sqlites_text() -> None:
    values = [0.5, -0.0, math.inf, -math.inf, None, 1e308]
    bound = _metric_bind().rows([_point(i + 1, v) for i, v in enumerate(values)])
    assert [row[6] for row in bound] == values
    assert math.copysign(1.0, bound[1][6]) == -1.0  # -0.0 keeps its sign
    assert {row[7] for row in bound} == {"2026-12-06 20:45:01.250000"}
    assert all(row[:6] == _point(i + 1, None)[:6] for i, row in enumerate(bound))


def test_a_batch_with_a_value_that_is_not_a_float_goes_through_the_float_processor() -> None:
    bound = _metric_bind().rows([_point(1, 0.25), _point(2, 3), _point(3, True)])
    assert [row[6] for row in bound] == [0.25, 3.0, 1.0]
    assert [type(row[6]) for row in bound] == [float, float, float]
    assert {row[7] for row in bound} == {"2026-12-06 20:45:01.250000"}


def test_rows_bound_here_are_stored_as_the_driver_reads_them_back() -> None:
    plan = insert_plan(MetricPoint.__table__, METRIC_COLUMNS, sqlite.dialect())
    connection = sqlite3.connect(":memory:")
    connection.execute(
        "CREATE TABLE metric_points (id INTEGER PRIMARY KEY, job_id, task_id, attempt, seq, name, step,"
        " value REAL, wall_time, UNIQUE (task_id, seq))"
    )
    connection.executemany(plan.sql, plan.bind.rows([_point(1, 2), _point(2, 0.5), _point(1, 9.0)]))
    stored = connection.execute("SELECT seq, value, typeof(value), wall_time FROM metric_points").fetchall()
    assert stored == [
        (1, 2.0, "real", "2026-12-06 20:45:01.250000"),
        (2, 0.5, "real", "2026-12-06 20:45:01.250000"),
    ]


def test_log_lines_bind_only_their_time() -> None:
    plan = insert_plan(LogLine.__table__, LOG_COLUMNS, sqlite.dialect())
    row = ("job", "task", 1, "stdout", "hello", AT, None)
    assert plan.bind.rows([row]) == [
        ("job", "task", 1, "stdout", "hello", "2026-12-06 20:45:01.250000", None)
    ]

"""How fast one thread puts telemetry rows into PostgreSQL, by the way they are sent (bench/README.md, PostgreSQL).

Starts a throwaway PostgreSQL server (testkit/mwms_testkit/postgres_server.py, default durability), creates the schema at
head with one placed task, then inserts `--rows` metric_points rows in 500-row batches, 20 batches per
transaction (as the coordinator's telemetry writer groups them), each way twice, interleaved:
  executemany   what the coordinator does today: SQLAlchemy's executemany of INSERT ... ON CONFLICT DO NOTHING
                (psycopg pipelines one INSERT per row);
  unnest        one INSERT ... SELECT FROM unnest(arrays) ON CONFLICT DO NOTHING per batch;
  copy_staged   COPY into a temp table, then INSERT ... SELECT ... ON CONFLICT DO NOTHING;
  copy_commit_drop   what server/services/observing/telemetry.py does: binary COPY into a temp table created in the
                transaction ON COMMIT DROP, then WITH moved AS (DELETE ... RETURNING) INSERT ... SELECT ...
                ORDER BY task_id, seq ON CONFLICT DO NOTHING;
  copy_delete_rows   the same with a temp table kept by the connection, ON COMMIT DELETE ROWS (the choice
                the first one was measured against);
  copy          COPY straight into the table (a duplicate row fails the batch: the writer would have to drop
                rows at or below the task's stored sequence first).
Then the staging table's own cost: transactions of one 10-row batch, copy_commit_drop beside copy_delete_rows.
Usage: python bench/pg_insert_ways.py [--rows 100000]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from sqlalchemy import text  # noqa: E402
from sqlalchemy.dialects.postgresql import insert as pg_insert  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from mwms.server.db.engine import Database  # noqa: E402
from mwms.server.db.migrate import upgrade_to_head  # noqa: E402
from mwms.server.db.models import Bundle, Job, MetricPoint  # noqa: E402
from mwms.server.schemas import JobCreate  # noqa: E402
from mwms.server.services.fleet.agents import Registration, register_agent  # noqa: E402
from mwms.server.services.job_life.jobs import create_job  # noqa: E402
from mwms.server.services.scheduler.scheduling import schedule_pending  # noqa: E402
from mwms_testkit.postgres_server import postgres_server  # noqa: E402

BATCH, BATCHES_PER_TRANSACTION = 500, 20
COLUMNS = ("job_id", "task_id", "attempt", "seq", "name", "step", "value", "wall_time")
UNNEST = text(
    "INSERT INTO metric_points (job_id, task_id, attempt, seq, name, step, value, wall_time) "
    "SELECT * FROM unnest(CAST(:job_id AS varchar[]), CAST(:task_id AS varchar[]), CAST(:attempt AS int[]), "
    "CAST(:seq AS int[]), CAST(:name AS varchar[]), CAST(:step AS int[]), CAST(:value AS float8[]), "
    "CAST(:wall_time AS timestamptz[])) ON CONFLICT DO NOTHING"
)
COPY_COLUMNS = f"metric_points ({', '.join(COLUMNS)})"


def executemany(session: Session, batch: list[dict[str, Any]]) -> None:
    session.connection().execute(pg_insert(MetricPoint.__table__).on_conflict_do_nothing(), batch)


def unnest(session: Session, batch: list[dict[str, Any]]) -> None:
    session.execute(UNNEST, {c: [row[c] for row in batch] for c in COLUMNS})


def _cursor(session: Session) -> Any:
    return session.connection().connection.driver_connection.cursor()  # type: ignore[union-attr]


def copy_staged(session: Session, batch: list[dict[str, Any]]) -> None:
    cursor = _cursor(session)
    cursor.execute("CREATE TEMP TABLE IF NOT EXISTS staged (LIKE metric_points INCLUDING DEFAULTS)")
    with cursor.copy(f"COPY {COPY_COLUMNS.replace('metric_points', 'staged')} FROM STDIN") as copy:
        for row in batch:
            copy.write_row([row[c] for c in COLUMNS])
    cursor.execute(
        f"INSERT INTO {COPY_COLUMNS} SELECT {', '.join(COLUMNS)} FROM staged ON CONFLICT DO NOTHING"
    )
    cursor.execute("TRUNCATE staged")


def _staged_binary(table: str, create: str) -> Callable[[Session, list[dict[str, Any]]], None]:
    names = ", ".join(COLUMNS)
    move = (
        f"WITH moved AS (DELETE FROM {table} RETURNING {names}) INSERT INTO {COPY_COLUMNS} "
        f"SELECT {names} FROM moved ORDER BY task_id, seq ON CONFLICT (task_id, seq) DO NOTHING"
    )

    def write(session: Session, batch: list[dict[str, Any]]) -> None:
        cursor = _cursor(session)
        cursor.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {table} {create} AS "
            f"SELECT {names} FROM metric_points WITH NO DATA"
        )
        with cursor.copy(f"COPY {table} ({names}) FROM STDIN (FORMAT BINARY)") as stream:
            stream.set_types(
                ["varchar", "varchar", "int4", "int4", "varchar", "int4", "float8", "timestamptz"]
            )
            for row in batch:
                stream.write_row([row[c] for c in COLUMNS])
        cursor.execute(move)

    return write


def copy(session: Session, batch: list[dict[str, Any]]) -> None:
    with _cursor(session).copy(f"COPY {COPY_COLUMNS} FROM STDIN") as stream:
        for row in batch:
            stream.write_row([row[c] for c in COLUMNS])


WAYS: dict[str, Callable[[Session, list[dict[str, Any]]], None]] = {
    "executemany": executemany,
    "unnest": unnest,
    "copy_staged": copy_staged,
    "copy_commit_drop": _staged_binary("staged_dropped", "ON COMMIT DROP"),
    "copy_delete_rows": _staged_binary("staged_kept", "ON COMMIT DELETE ROWS"),
    "copy": copy,
}


def placed_task(db: Database) -> tuple[str, str]:
    with db.write() as session:
        session.add(Bundle(digest="b" * 64, size=1, archive_format="tar.gz"))
        slot = [{"kind": "cpu", "index": 0, "name": "cpu-slot-0"}]
        register_agent(session, Registration("bench", "bench", "127.0.0.1", 20000, 20010, slot, "t"), 30)
        job = create_job(session, JobCreate(bundle_digest="b" * 64, command=["python", "x.py"], workers=1))
    with db.write() as session:
        schedule_pending(session)
    with db.read() as session:
        stored = session.get(Job, job.id)
        assert stored is not None
        return job.id, stored.attempts[0].tasks[0].id


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    with postgres_server() as server:
        db = Database(server.url)
        upgrade_to_head(db.engine)
        job_id, task_id = placed_task(db)
        now = datetime.now(timezone.utc)
        offset = 0
        for round_ in (1, 2):
            for name, write in WAYS.items():
                rows = [
                    {"job_id": job_id, "task_id": task_id, "attempt": 1, "seq": offset + i, "name": "loss"}
                    | {"step": offset + i, "value": 0.5, "wall_time": now}
                    for i in range(1, args.rows + 1)
                ]
                offset += args.rows
                began = time.perf_counter()
                per_transaction = BATCH * BATCHES_PER_TRANSACTION
                for start in range(0, len(rows), per_transaction):
                    with db.write() as session:
                        for at in range(start, min(len(rows), start + per_transaction), BATCH):
                            write(session, rows[at : at + BATCH])
                rate = args.rows / (time.perf_counter() - began)
                print(f"round {round_}  {name:<16} {rate:>10,.0f} rows/s", flush=True)
        staging_cost(db, job_id, task_id, offset)
        db.dispose()
    return 0


def staging_cost(db: Database, job_id: str, task_id: str, offset: int, transactions: int = 500) -> None:
    """What the staging table costs a transaction: 500 transactions of one 10-row batch each, both ways."""
    now = datetime.now(timezone.utc)
    for round_ in (1, 2, 3):
        for name, write in (
            ("copy_commit_drop", WAYS["copy_commit_drop"]),
            ("copy_delete_rows", WAYS["copy_delete_rows"]),
        ):
            took = []
            for _ in range(transactions):
                batch = [
                    {"job_id": job_id, "task_id": task_id, "attempt": 1, "seq": offset + i, "name": "loss"}
                    | {"step": offset + i, "value": 0.5, "wall_time": now}
                    for i in range(1, 11)
                ]
                offset += len(batch)
                began = time.perf_counter()
                with db.write() as session:
                    write(session, batch)
                took.append(time.perf_counter() - began)
            median_ms = sorted(took)[len(took) // 2] * 1000
            print(
                f"round {round_}  {name:<16} {median_ms:>7.2f} ms a transaction of one 10-row batch (median)"
            )


if __name__ == "__main__":
    raise SystemExit(main())

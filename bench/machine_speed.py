"""How fast this machine runs just before a scenario, for comparing figures of different days and hours: the
reference VM's speed swings between days and within an hour, and every figure follows it (bench/README.md).

- `python_10m_additions_s`: 10 M additions in a pure-Python loop (best of three shorter runs, scaled);
- `sqlite_insert_us_per_row`: a row of a 20,000-row executemany into an indexed SQLite table in WAL mode,
  committed (best of three);
- `ingest_store_us_per_item`: CPU per item of the ingest process's own transactions (store_group: decode,
  store, commit) on a fresh coordinator database, 50 tasks' log and metric batches of 500, 20 batches a
  transaction, after a round of warm-up. Sustained, not a best of three, so it follows the slow hours the two
  above can miss: 6.8 us on a day the ingest scenario met its targets, 15-20 us on days it fell far short.
"""

from __future__ import annotations

import math
import sqlite3
import tempfile
import time
from pathlib import Path

from sqlalchemy import select

from mwms.server.db.models import Agent, Task
from mwms.server.live.ingest_store import RawBatch, store_group
from mwms.server.rpc.convert import telemetry_items
from mwms.v1 import agent_pb2 as pb
from mwms_testkit.coordinator_rows import place_task, seeded_database

STORE_TASKS = 50
STORE_BATCH = 500
STORE_GROUP = 20


def machine_speed() -> dict[str, float]:
    best_loop = best_insert = math.inf
    additions, rows = 2_000_000, 20_000
    with tempfile.TemporaryDirectory() as tmp:
        db = sqlite3.connect(Path(tmp) / "speed.db", isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(
            "CREATE TABLE t (id INTEGER PRIMARY KEY, task TEXT, seq INTEGER, text TEXT, UNIQUE (task, seq))"
        )
        for round_ in range(3):
            started = time.perf_counter()
            total = 0
            for i in range(additions):
                total += i
            best_loop = min(best_loop, time.perf_counter() - started)
            data = [
                (f"task-{i % 50}", round_ * rows + i, f"step {i} loss 0.{i % 1000:03d}") for i in range(rows)
            ]
            started = time.perf_counter()
            db.execute("BEGIN IMMEDIATE")
            db.executemany("INSERT INTO t (task, seq, text) VALUES (?, ?, ?)", data)
            db.execute("COMMIT")
            best_insert = min(best_insert, time.perf_counter() - started)
        db.close()
    return {
        "python_10m_additions_s": round(best_loop * 10_000_000 / additions, 3),
        "sqlite_insert_us_per_row": round(best_insert / rows * 1e6, 3),
        "ingest_store_us_per_item": round(ingest_store_us_per_item(), 2),
    }


def ingest_store_us_per_item(rounds: int = 4) -> float:
    """CPU microseconds per item of store_group over `rounds` rounds after one of warm-up (module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        agents = [f"speed-{i}" for i in range(STORE_TASKS)]
        db = seeded_database(Path(tmp) / "coordinator.db", "d" * 64, agents)
        try:
            with db.read() as session:
                agent_ids = list(session.scalars(select(Agent.id)))
            tasks = [place_task(db, agent_id, digest="d" * 64) for agent_id in agent_ids]
            now_ms = int(time.time() * 1000)
            cpu = 0.0
            items = 0
            for round_ in range(rounds + 1):
                batches = _round_batches(tasks, round_ * STORE_BATCH, now_ms)
                started = time.process_time()
                for first in range(0, len(batches), STORE_GROUP):
                    stored = store_group(db, batches[first : first + STORE_GROUP], telemetry_items)
                    assert not any(isinstance(o, Exception) for o in stored.outcomes), stored.outcomes[:2]
                if round_:
                    cpu += time.process_time() - started
                    items += sum(batch.size for batch in batches)
        finally:
            db.dispose()
    return cpu / items * 1e6


def _round_batches(tasks: list[Task], base: int, now_ms: int) -> list[RawBatch]:
    """A log and a metric batch of STORE_BATCH items per task, seqs after `base`, as agents send them."""
    seqs = range(base + 1, base + STORE_BATCH + 1)
    batches = []
    for task in tasks:
        logs = pb.LogBatch(
            task_id=task.id,
            lines=[
                pb.LogLine(seq=s, stream="stdout", text=f"step {s} loss 0.{s % 1000:03d}", unix_ms=now_ms)
                for s in seqs
            ],
        )
        metrics = pb.MetricBatch(
            task_id=task.id,
            points=[pb.MetricPoint(seq=s, name="loss", step=s, value=1.0 / s, unix_ms=now_ms) for s in seqs],
        )
        batches.append(RawBatch(task.agent_id, task.id, "logs", logs.SerializeToString(), STORE_BATCH))
        batches.append(RawBatch(task.agent_id, task.id, "metrics", metrics.SerializeToString(), STORE_BATCH))
    return batches


def speed_line(speed: dict[str, float]) -> str:
    return (
        f"10 M Python additions {speed['python_10m_additions_s']} s, "
        f"a SQLite row {speed['sqlite_insert_us_per_row']} us, "
        f"an ingest item stored {speed['ingest_store_us_per_item']} us of CPU"
    )

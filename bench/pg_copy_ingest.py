"""Metric points and log lines per second through the coordinator's own store functions on PostgreSQL:
COPY through a staging table (what server/services/observing/telemetry.py does from COPY_MIN_ROWS rows a batch) beside
today's executemany of INSERT ... ON CONFLICT DO NOTHING (the ~29,000 points/s that bench/README.md reports).

Starts a throwaway PostgreSQL server (testkit/mwms_testkit/postgres_server.py, default durability), creates the schema at
head with one placed task, then calls store_metric_points / store_log_lines in 500-item batches (the agent's
BATCH_MAX_ITEMS), 20 batches per transaction, each way `--rounds` times, interleaved so that the machine's
load falls on both alike. Then points in small batches (1 to 32 items, 200 batches a transaction), COPY
whatever the length beside the executemany: where COPY's three round trips cost more than it saves, which
is what sets COPY_MIN_ROWS.
Writes the figures to bench/results_pg_copy.json.
Usage: python bench/pg_copy_ingest.py [--items 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from pg_insert_ways import placed_task  # noqa: E402

from mwms.server.db.engine import Database  # noqa: E402
from mwms.server.db.migrate import upgrade_to_head  # noqa: E402
from mwms.server.db.models import Task  # noqa: E402
from mwms.server.services.observing import telemetry  # noqa: E402
from mwms.server.services.observing.telemetry import IncomingLine, IncomingPoint  # noqa: E402
from mwms_testkit.postgres_server import postgres_server  # noqa: E402

BATCH, BATCHES_PER_TRANSACTION = 500, 20
SMALL_BATCHES, SMALL_BATCHES_PER_TRANSACTION = (1, 2, 4, 8, 16, 32), 200
RESULTS = ROOT / "bench" / "results_pg_copy.json"
TODAY_POINTS_PER_S = 29_000  # bench/README.md, PostgreSQL ingest through the executemany
WAYS = {"copy": telemetry.COPY_MIN_ROWS, "executemany": sys.maxsize}  # the COPY_MIN_ROWS each way runs with
SMALL_WAYS = {"copy": 1, "executemany": sys.maxsize}  # small batches: COPY whatever their length


def _points(first: int, count: int) -> list[IncomingPoint]:
    return [IncomingPoint(seq, "loss", seq, 0.5, 1764500000000 + seq) for seq in range(first, first + count)]


def _lines(first: int, count: int) -> list[IncomingLine]:
    text = "step 1234/100000 - loss: 0.4321 - accuracy: 0.8765 - 12ms/step"
    return [IncomingLine(seq, "stdout", text, 1764500000000 + seq) for seq in range(first, first + count)]


def _store(
    db: Database, task_id: str, kind: str, first: int, items: int, batch: int, per_transaction: int
) -> float:
    """Items per second storing `items` of `kind` from seq `first`."""
    make: Callable[[int, int], list] = _points if kind == "points" else _lines
    store = telemetry.store_metric_points if kind == "points" else telemetry.store_log_lines
    batches = [make(start, min(batch, first + items - start)) for start in range(first, first + items, batch)]
    began = time.perf_counter()
    for at in range(0, len(batches), per_transaction):
        with db.write() as session:
            task = session.get(Task, task_id)
            assert task is not None
            for one in batches[at : at + per_transaction]:
                outcome = store(session, task, one)  # type: ignore[arg-type]
                assert outcome.rejected == 0, outcome
    return items / (time.perf_counter() - began)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    load_before = [round(x, 2) for x in os.getloadavg()]
    rates: dict[str, dict[str, list[float]]] = {
        kind: {way: [] for way in WAYS} for kind in ("points", "lines")
    }
    small: dict[str, dict[str, list[float]]] = {
        str(size): {way: [] for way in WAYS} for size in SMALL_BATCHES
    }
    seq = {"points": 1, "lines": 1}
    with postgres_server() as server:
        db = Database(server.url)
        upgrade_to_head(db.engine)
        _job_id, task_id = placed_task(db)
        try:
            for round_ in range(1, args.rounds + 1):
                for kind in ("points", "lines"):
                    for way, min_rows in WAYS.items():
                        telemetry.COPY_MIN_ROWS = min_rows
                        rate = _store(
                            db, task_id, kind, seq[kind], args.items, BATCH, BATCHES_PER_TRANSACTION
                        )
                        seq[kind] += args.items
                        rates[kind][way].append(rate)
                        print(f"round {round_}  {kind:<6} {way:<12} {rate:>10,.0f} items/s", flush=True)
            for size in SMALL_BATCHES:
                for _round in range(args.rounds):
                    for way, min_rows in SMALL_WAYS.items():
                        telemetry.COPY_MIN_ROWS = min_rows
                        items = size * SMALL_BATCHES_PER_TRANSACTION * 5
                        rate = _store(
                            db, task_id, "points", seq["points"], items, size, SMALL_BATCHES_PER_TRANSACTION
                        )
                        seq["points"] += items
                        small[str(size)][way].append(rate)
                line = "  ".join(
                    f"{way} {statistics.median(small[str(size)][way]):>8,.0f}" for way in SMALL_WAYS
                )
                print(f"batches of {size:>2} points: {line} points/s (median)", flush=True)
        finally:
            telemetry.COPY_MIN_ROWS = WAYS["copy"]
            db.dispose()
    medians = {
        kind: {way: round(statistics.median(r)) for way, r in by_way.items()}
        for kind, by_way in rates.items()
    }
    print(
        f"store_metric_points, 500-point batches: COPY {medians['points']['copy']:,} points/s, executemany "
        f"{medians['points']['executemany']:,} (today's executemany ~{TODAY_POINTS_PER_S:,} points/s)"
    )
    RESULTS.write_text(
        json.dumps(
            {
                "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "machine": {
                    "cpus": os.cpu_count(),
                    "processor": _cpu_model(),
                    "python": platform.python_version(),
                    "load_average_before": load_before,
                    "load_average_after": [round(x, 2) for x in os.getloadavg()],
                },
                "items_per_round": args.items,
                "batch": BATCH,
                "batches_per_transaction": BATCHES_PER_TRANSACTION,
                "copy_min_rows": WAYS["copy"],
                "today_executemany_points_per_s": TODAY_POINTS_PER_S,
                "items_per_s": {
                    kind: {w: [round(x) for x in r] for w, r in by_way.items()}
                    for kind, by_way in rates.items()
                },
                "median_items_per_s": medians,
                "small_batches_points_per_s": {
                    size: {w: round(statistics.median(r)) for w, r in by_way.items()}
                    for size, by_way in small.items()
                },
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    raise SystemExit(main())

"""SQLite's writers take turns (server/db/write_turns.py): a writer that waits behind another one holding the
write lock in back-to-back transactions (as the ingest process does) gets it after about one of them, not
whenever SQLite's polling busy handler happens to hit a gap. A real SQLite file, a real second process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from mwms.server.db.engine import Database
from mwms_testkit.cluster import wait_until

HOLD_S = 0.05  # each of the other writer's transactions
RUN_S = 3.0  # how long it writes back to back


def hammer_in_process(database: Database, started: threading.Event) -> None:
    deadline = time.monotonic() + RUN_S
    while time.monotonic() < deadline:
        with database.write() as session:
            session.connection()
            started.set()
            time.sleep(HOLD_S)


HAMMER = textwrap.dedent(
    """
    import sys, time
    from mwms.server.db.engine import Database
    database = Database(sys.argv[1])
    deadline = time.monotonic() + float(sys.argv[2])
    print("writing", flush=True)
    while time.monotonic() < deadline:
        with database.write() as session:
            session.connection()
            time.sleep(float(sys.argv[3]))
    """
)


@pytest.mark.parametrize("other", ["thread", "process"])
def test_a_waiting_writer_gets_its_turn_between_back_to_back_transactions(db: Database, other: str) -> None:
    if other == "thread":
        started = threading.Event()
        writer = threading.Thread(target=hammer_in_process, args=(db, started), daemon=True)
        writer.start()
        assert started.wait(10)
        alive = writer.is_alive
    else:
        process = subprocess.Popen(
            [sys.executable, "-c", HAMMER, db.url, str(RUN_S), str(HOLD_S)], stdout=subprocess.PIPE, text=True
        )
        assert process.stdout is not None and process.stdout.readline().strip() == "writing"
        alive = lambda: process.poll() is None  # noqa: E731
    time.sleep(0.2)  # well into its back-to-back transactions
    waits = []
    for _ in range(5):
        began = time.monotonic()
        with db.write() as session:
            session.connection()
        waits.append(time.monotonic() - began)
    assert alive(), "the other writer stopped before the waits were measured"
    # About one of its transactions each (50 ms), with room for a loaded machine; SQLite's polling alone
    # left a writer waiting until the other stopped.
    assert max(waits) < 0.5, waits
    wait_until(lambda: not alive(), RUN_S + 10, "the other writer's end")


def test_turn_files_sit_beside_the_database_and_a_write_in_a_write_takes_none(db: Database) -> None:
    database_file = Path(db.engine.url.database or "")
    with db.write() as outer:
        outer.connection()
        assert Path(f"{database_file}-writers").exists() and Path(f"{database_file}-writers.door").exists()
        # The same thread asking again does not wait on its own turn (SQLite's locking then decides).
        with db._turns.turn():
            pass

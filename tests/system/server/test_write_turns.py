"""SQLite's writers take turns (server/db/write_turns.py): a writer that waits behind another one holding the
write lock in back-to-back transactions (as the ingest process does) gets it after about one of them, not
whenever SQLite's polling busy handler happens to hit a gap; writers get their turns in the order they asked,
whichever process or thread they write from. A real SQLite file, real other processes.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from mwms.server.db import write_turns
from mwms.server.db.engine import Database
from mwms.server.db.write_turns import COUNTER, WriteTurns
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


def test_turn_file_sits_beside_the_database_and_a_write_in_a_write_takes_none(db: Database) -> None:
    database_file = Path(db.engine.url.database or "")
    with db.write() as outer:
        outer.connection()
        assert Path(f"{database_file}-writers").exists()
        # The same thread asking again does not wait on its own turn (SQLite's locking then decides).
        with db._turns.turn():
            pass


WAITER = textwrap.dedent(
    """
    import sys, time
    from mwms.server.db.write_turns import WriteTurns
    with WriteTurns(sys.argv[1]).turn():
        with open(sys.argv[2], "a") as order:
            order.write(sys.argv[3] + "\\n")
        time.sleep(0.02)
    """
)


def tickets_taken(turns: WriteTurns) -> int:
    assert turns.path is not None
    return COUNTER.unpack(turns.path.read_bytes()[: COUNTER.size])[0]


def test_writers_get_their_turns_in_the_order_they_asked_whichever_process_or_thread(tmp_path: Path) -> None:
    """Three writers wait behind a fourth: two single-threaded processes and a thread of a process whose other
    thread keeps the interpreter busy (as the coordinator's event loop does). Each gets its turn in the order it
    asked, every time; before, they raced for a lock tried every millisecond and the busy process's thread lost."""
    database_file = str(tmp_path / "turns.db")
    turns = WriteTurns(database_file)
    order_file = tmp_path / "order"
    stop = threading.Event()

    def busy() -> None:  # holds the interpreter's lock as long as it is let
        while not stop.is_set():
            sum(range(10_000))

    def thread_waiter(name: str) -> None:
        with turns.turn():
            with order_file.open("a") as order:
                order.write(name + "\n")
            time.sleep(0.02)

    asked = []
    workers: list[threading.Thread | subprocess.Popen[bytes]] = []
    threading.Thread(target=busy, daemon=True).start()
    try:
        with turns.turn():
            for name in ["process-1", "thread-1", "process-2", "thread-2", "process-3"]:
                before = tickets_taken(turns)
                if name.startswith("thread"):
                    thread = threading.Thread(target=thread_waiter, args=(name,), daemon=True)
                    thread.start()
                    workers.append(thread)
                else:
                    workers.append(
                        subprocess.Popen([sys.executable, "-c", WAITER, database_file, str(order_file), name])
                    )
                wait_until(lambda before=before: tickets_taken(turns) > before, 30, f"{name}'s ticket")
                asked.append(name)
            assert not order_file.exists(), "a writer wrote while another held the turn"
    finally:
        for worker in workers:
            if isinstance(worker, threading.Thread):
                worker.join(30)
            else:
                assert worker.wait(30) == 0
        stop.set()
    assert order_file.read_text().split() == asked


def test_a_writer_that_dies_waiting_or_writing_passes_its_turn_on(tmp_path: Path) -> None:
    database_file = str(tmp_path / "turns.db")
    turns = WriteTurns(database_file)
    order_file = tmp_path / "order"
    with turns.turn():
        before = tickets_taken(turns)
        killed = subprocess.Popen([sys.executable, "-c", WAITER, database_file, str(order_file), "killed"])
        wait_until(lambda: tickets_taken(turns) > before, 30, "the doomed writer's ticket")
        next_one = subprocess.Popen([sys.executable, "-c", WAITER, database_file, str(order_file), "next"])
        wait_until(lambda: tickets_taken(turns) > before + 1, 30, "the next writer's ticket")
        killed.kill()
        killed.wait(30)
    assert next_one.wait(30) == 0
    assert order_file.read_text().split() == ["next"]


def test_a_writer_that_waited_too_long_goes_on_to_sqlites_own_locking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(write_turns, "MAX_WAIT_S", 0.3)
    turns = WriteTurns(str(tmp_path / "turns.db"))
    went_on = threading.Event()

    def waiter() -> None:
        with turns.turn():
            went_on.set()

    with turns.turn():  # held past the waiter's patience: a holder that hangs
        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        assert went_on.wait(30), "the waiter still waits"
    thread.join(30)
    assert "no turn to write after" in caplog.text


def test_waiting_writers_wait_in_the_kernel_not_by_trying(tmp_path: Path) -> None:
    """A queue of waiting threads costs no CPU: each blocks until the writer before it finishes. (Trying
    every millisecond took the interpreter's lock from the coordinator's event loop 32,000 times a second.)"""
    turns = WriteTurns(str(tmp_path / "turns.db"))

    def write() -> None:
        with turns.turn():
            pass

    waiters = [threading.Thread(target=write, daemon=True) for _ in range(16)]
    with turns.turn():
        for waiter in waiters:
            waiter.start()
        wait_until(lambda: tickets_taken(turns) == 17, 30, "the waiters' tickets")
        cpu_before = time.process_time()
        time.sleep(1.0)
        cpu_spent = time.process_time() - cpu_before
    for waiter in waiters:
        waiter.join(30)
    assert cpu_spent < 0.1, f"16 waiting writers spent {cpu_spent:.2f} s of CPU in 1 s"

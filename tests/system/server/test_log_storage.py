"""Log lines in the coordinator's database and read back. Redrawn lines (LogLine.replaces_seq, a `\\r`
progress bar): the replaced state is marked superseded, resends are stored once, pages and failure reasons show
each line's newest state. Long lines (up to 64 KiB each): a page holds at most MAX_LOG_PAGE_CHARS of text (a
job printing them made GET /jobs/{id}/logs?tail=10000 cost the coordinator 1.4 GiB for one request), and a
failure reason quotes each line cut to FAILURE_LINE_CHARS.

On SQLite and on a real PostgreSQL server (COPY for batches of 8 rows or more); PostgreSQL is skipped where
no server can start.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from mwms.server.db.engine import Database
from mwms.server.db.migrate import upgrade_to_head
from mwms.server.db.models import Agent, Job, LogLine, Task
from mwms.server.services.fleet.agent_messages import accept_logs
from mwms.server.services.fleet.agents import Registration, register_agent
from mwms.server.services.job_life import lifecycle
from mwms.server.services.job_life.failure_reasons import FAILURE_LINE_CHARS
from mwms.server.services.observing import log_pages
from mwms.server.services.observing.telemetry import IncomingLine
from mwms.server.services.observing.telemetry_reads import MAX_LOG_PAGE_CHARS, read_logs
from mwms_testkit.coordinator_rows import place_task, seeded_database

AT_MS = 1764500000000
DIGEST = "d" * 64


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """A migrated database with one online one-slot agent."""
    if request.param == "sqlite":
        database = seeded_database(tmp_path / "redraws.db", DIGEST, ["redraw-agent"])
    else:
        server = request.getfixturevalue("postgres")  # the session's server (tests/conftest.py)
        database = Database(server.create_database(f"redraws_{request.node.name[-30:].lower()}"))
        upgrade_to_head(database.engine)
        slot = [{"kind": "cpu", "index": 0, "name": "s"}]
        with database.write() as session:
            register_agent(
                session, Registration("redraw-agent", "h", "127.0.0.1", 20000, 20010, slot, "t"), 30
            )
    yield database
    database.dispose()


@pytest.fixture
def task(database: Database) -> Task:
    with database.read() as session:
        agent_id = session.scalars(select(Agent.id)).one()
    return place_task(database, agent_id, digest=DIGEST)


def line(seq: int, text: str, replaces: int = 0, stream: str = "stdout") -> IncomingLine:
    return IncomingLine(seq=seq, stream=stream, text=text, unix_ms=AT_MS + seq, replaces_seq=replaces)


def store(database: Database, task: Task, lines: list[IncomingLine]) -> None:
    with database.write() as session:
        outcome = accept_logs(session, task.agent_id, task.id, lines)
    assert outcome.rejected == 0, outcome.reason
    assert outcome.acked_seq == max(x.seq for x in lines)


def stored(database: Database) -> list[tuple[int, str, int | None, bool]]:
    with database.read() as session:
        rows = session.execute(
            select(LogLine.seq, LogLine.text, LogLine.replaces_seq, LogLine.superseded).order_by(LogLine.seq)
        ).all()
    return [tuple(row) for row in rows]  # type: ignore[misc]


# An epoch of a Keras fit: a plain line, a bar redrawn twice, its final state, and a warning on stderr between.
EPOCH = [
    line(1, "Epoch 1/1"),
    line(2, " 1/10 [>....]"),
    line(3, "a warning", stream="stderr"),
    line(4, " 5/10 [==>..]", replaces=2),
    line(5, "10/10 [=====] - loss: 0.1", replaces=4),
    line(6, "saved"),
]


def test_a_redraw_supersedes_the_state_it_replaces_and_a_resend_is_stored_once(
    database: Database, task: Task
) -> None:
    store(database, task, EPOCH[:2])
    store(database, task, EPOCH[2:4])  # the replaced line came in an earlier batch
    store(database, task, EPOCH[4:])
    expected = [
        (1, "Epoch 1/1", None, False),
        (2, " 1/10 [>....]", None, True),
        (3, "a warning", None, False),
        (4, " 5/10 [==>..]", 2, True),
        (5, "10/10 [=====] - loss: 0.1", 4, False),
        (6, "saved", None, False),
    ]
    assert stored(database) == expected
    # Failover: the agent resends everything unacknowledged, whole and overlapping.
    store(database, task, EPOCH)
    store(database, task, EPOCH[3:])
    assert stored(database) == expected


def test_a_batch_through_copy_keeps_the_marks(database: Database, task: Task) -> None:
    lines = [line(1, "0%")] + [line(seq, f"{seq * 10}%", replaces=seq - 1) for seq in range(2, 11)]
    store(database, task, lines)  # 10 rows: COPY on PostgreSQL
    rows = stored(database)
    assert [superseded for *_, superseded in rows] == [True] * 9 + [False]
    assert rows[-1] == (10, "100%", 9, False)


def test_a_redraw_naming_itself_or_a_later_line_is_a_line_of_its_own(database: Database, task: Task) -> None:
    store(database, task, [line(1, "one"), line(2, "two", replaces=2), line(3, "three", replaces=7)])
    store(database, task, [line(4, "four", replaces=-1)])
    assert stored(database) == [
        (1, "one", None, False),
        (2, "two", None, False),
        (3, "three", None, False),
        (4, "four", None, False),
    ]


def page(session: Session, task: Task, **options: object) -> list[tuple[int, str, bool]]:
    found = log_pages.read_log_page(session, task.job_id, task=0, attempt=None, **options)  # type: ignore[arg-type]
    return [(entry.seq, entry.text, entry.redraw) for entry in found.lines]


def test_pages_show_each_line_as_it_stands_and_a_follower_every_state(database: Database, task: Task) -> None:
    store(database, task, EPOCH[:4])
    with database.read() as session:
        # The newest lines: the bar as it stands now, not marked a redraw (what it replaced is not there).
        assert page(session, task, after=0, tail=100) == [
            (1, "Epoch 1/1", False),
            (3, "a warning", False),
            (4, " 5/10 [==>..]", False),
        ]
        assert page(session, task, after=0, tail=1) == [(4, " 5/10 [==>..]", False)]
        cursor = log_pages.read_log_page(
            session, task.job_id, task=0, attempt=None, after=0, tail=100
        ).next_after
        assert page(session, task, after=0, tail=100, replaced=True) == [
            (1, "Epoch 1/1", False),
            (2, " 1/10 [>....]", False),
            (3, "a warning", False),
            (4, " 5/10 [==>..]", True),
        ]
    store(database, task, EPOCH[4:])
    with database.read() as session:
        # After a cursor every state comes, marked: the final state replaces the one the first page showed.
        assert page(session, task, after=cursor, tail=100) == [
            (5, "10/10 [=====] - loss: 0.1", True),
            (6, "saved", False),
        ]
        assert page(session, task, after=1, tail=100) == [
            (2, " 1/10 [>....]", False),
            (3, "a warning", False),
            (4, " 5/10 [==>..]", True),
            (5, "10/10 [=====] - loss: 0.1", True),
            (6, "saved", False),
        ]


def test_a_failure_reason_quotes_final_states_only(database: Database, task: Task) -> None:
    bar = [line(1, "Epoch 1/1")] + [
        line(seq, f"{seq}/50", replaces=seq - 1 if seq > 2 else 0) for seq in range(2, 51)
    ]
    store(database, task, bar + [line(51, "Traceback: boom", stream="stderr")])
    with database.read() as session:
        stored_task = session.get(Task, task.id)
        assert stored_task is not None
        assert lifecycle.last_log_lines(session, stored_task) == ["Epoch 1/1", "50/50", "Traceback: boom"]


def test_a_failure_reason_quotes_long_lines_cut(database: Database, task: Task) -> None:
    cut = FAILURE_LINE_CHARS
    store(database, task, [line(1, "é" * (64 * 1024)), line(2, "x" * cut), line(3, "Traceback: boom")])
    with database.read() as session:
        stored_task = session.get(Task, task.id)
        assert stored_task is not None
        quoted = lifecycle.last_log_lines(session, stored_task)
    assert quoted == ["é" * cut + " … (line cut: the log has it whole)", "x" * cut, "Traceback: boom"]


def test_a_page_stops_at_its_text_budget_and_always_holds_a_line(database: Database, task: Task) -> None:
    width = 1000
    store(database, task, [line(seq, f"{seq:04d}".ljust(width, "x")) for seq in range(1, 11)])
    store(database, task, [line(11, "y" * (5 * width))])

    def seqs(after: int = 0, tail: int = 1000, max_chars: int = MAX_LOG_PAGE_CHARS) -> list[int]:
        with database.read() as session:
            job = session.get(Job, task.job_id)
            assert job is not None
            rows = read_logs(
                session, job, task_index=None, attempt=None, after=after, tail=tail, max_chars=max_chars
            )
            return [line.seq for line, _ in rows]

    assert seqs() == list(range(1, 12))  # far within the budget: every line
    assert seqs(max_chars=7 * width) == [9, 10, 11]  # the newest that fit, oldest first
    assert seqs(max_chars=7 * width - 1) == [10, 11]
    assert seqs(max_chars=width) == [11]  # one line, though longer than the budget
    assert seqs(tail=1, max_chars=10 * width) == [11]
    with database.read() as session:
        first = session.scalars(select(func.min(LogLine.id))).one()
    assert seqs(after=first, max_chars=3 * width + 10) == [2, 3, 4]  # after a cursor: the first that fit
    assert seqs(after=first, max_chars=1) == [2]
    assert seqs(after=first, tail=2) == [2, 3]

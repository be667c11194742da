"""A log page holds at most MAX_LOG_PAGE_CHARS of text, on SQLite and on PostgreSQL (whose rows come through a
server-side cursor): the newest lines that fit, or the first after a cursor, and always one line however long.
A job printing 64 KiB lines made GET /jobs/{id}/logs?tail=10000 cost the coordinator 1.4 GiB for one request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from mwms.server.db.engine import Database
from mwms.server.db.models import Agent, Job, Task, utcnow
from mwms.server.services.observing import telemetry
from mwms.server.services.observing.telemetry_reads import MAX_LOG_PAGE_CHARS, read_logs
from mwms_testkit.coordinator_rows import place_task, seeded_database

DIGEST = "d" * 64
WIDTH = 1000


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        database = seeded_database(tmp_path / "logs.db", DIGEST, ("alpha",))
    else:
        server = request.getfixturevalue("postgres")
        database = seeded_database(server.create_database(f"logs_{tmp_path.name[-20:]}"), DIGEST, ("alpha",))
    yield database
    database.dispose()


def test_a_page_stops_at_its_text_budget_and_always_holds_a_line(db: Database) -> None:
    with db.read() as session:
        agent = session.scalars(select(Agent.id)).one()
    task = place_task(db, agent, digest=DIGEST)
    now_ms = int(utcnow().timestamp() * 1000)
    with db.write() as session:
        lines = [
            telemetry.IncomingLine(seq, "stdout", f"{seq:04d}".ljust(WIDTH, "x"), now_ms)
            for seq in range(1, 11)
        ]
        lines.append(telemetry.IncomingLine(11, "stdout", "y" * (5 * WIDTH), now_ms))
        telemetry.store_log_lines(session, session.get(Task, task.id), lines)

    def seqs(after: int = 0, tail: int = 1000, max_chars: int = MAX_LOG_PAGE_CHARS) -> list[int]:
        with db.read() as session:
            job = session.get(Job, task.job_id)
            assert job is not None
            rows = read_logs(
                session, job, task_index=None, attempt=None, after=after, tail=tail, max_chars=max_chars
            )
            return [line.seq for line, _ in rows]

    assert seqs() == list(range(1, 12))  # far within the budget: every line
    assert seqs(max_chars=7 * WIDTH) == [9, 10, 11]  # the newest that fit, oldest first
    assert seqs(max_chars=7 * WIDTH - 1) == [10, 11]
    assert seqs(max_chars=WIDTH) == [11]  # one line, though longer than the budget
    assert seqs(tail=1, max_chars=10 * WIDTH) == [11]
    with db.read() as session:
        job = session.get(Job, task.job_id)
        assert job is not None
        first = read_logs(session, job, task_index=None, attempt=None, after=0, tail=11)[0][0].id
    assert seqs(after=first, max_chars=3 * WIDTH + 10) == [2, 3, 4]  # after a cursor: the first that fit
    assert seqs(after=first, max_chars=1) == [2]
    assert seqs(after=first, tail=2) == [2, 3]

"""The scheduler pass on a real SQLite database: a backlog of jobs that do not fit costs no reads per job."""

from __future__ import annotations

from mwms.server.db.engine import Database
from mwms.server.db.models import Job
from mwms.server.schemas import JobCreate
from mwms.server.services.job_life.jobs import create_job
from mwms.server.services.scheduler.scheduling import schedule_pending
from mwms.server.states import JobState
from mwms_testkit.coordinator_rows import seeded_database
from mwms_testkit.sql_statements import recorded


def _statements_of_a_pass(db: Database) -> tuple[int, list[str]]:
    with recorded(db.engine) as statements, db.write() as session:
        placed = schedule_pending(session)
    return len(statements), placed


def test_waiting_jobs_do_not_each_read_the_agents_and_placed_ones_see_what_is_left(tmp_path) -> None:
    db = seeded_database(tmp_path / "s.db", "b" * 64, ("a-1", "a-2"))
    with db.write() as session:
        spec = {"bundle_digest": "b" * 64, "command": ["python", "x.py"]}
        first = create_job(session, JobCreate(**spec, workers=1))
        second = create_job(session, JobCreate(**spec, workers=1))
        third = create_job(session, JobCreate(**spec, workers=1))  # two agents, one slot each: waits
        too_big = [create_job(session, JobCreate(**spec, workers=3)).id for _ in range(5)]
    _, placed = _statements_of_a_pass(db)
    assert len(placed) == 2
    with db.read() as session:
        states = {job.id: job.state for job in session.query(Job)}
    assert states[first.id] == states[second.id] == JobState.SCHEDULED.value, states
    assert states[third.id] == JobState.PENDING.value
    assert {states[i] for i in too_big} == {JobState.PENDING.value}

    few, _ = _statements_of_a_pass(db)
    with db.write() as session:
        for _ in range(40):
            create_job(session, JobCreate(**spec, workers=3))
    many, _ = _statements_of_a_pass(db)
    # Waiting jobs are read in one query and their reasons written in one batch: 40 more cost no statement
    # of their own (a pass reads the agents' offer once, whatever the backlog).
    per_job = (many - few) / 40
    assert per_job < 0.2, (few, many)
    db.dispose()

"""Stack dumps are bounded: one request per job every few seconds, the newest few kept, each dump's size."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select
from test_hangs import SLEEPING, answer, running_job

from mwms.server.db.models import StackDump, StackRequest, utcnow
from mwms.server.limits import TooManyRequests
from mwms.server.services.observing import stacks
from mwms.stack_dumps import MAX_STACK_BYTES

# What the shared `db` fixture (tests/conftest.py) holds.
pytestmark = pytest.mark.db_seed("c" * 64, agents=("a", "b"))


def test_a_second_request_too_soon_is_refused_and_hang_dumps_are_not(db):
    job_id = running_job(db)
    now = utcnow()
    with db.write() as session:
        stacks.open_stack_request(session, job_id, "request", "ann", now, any_owner=True)
    with pytest.raises(TooManyRequests, match=r"one dump per job every 2 s"), db.write() as session:
        stacks.open_stack_request(
            session, job_id, "request", "bob", now + timedelta(seconds=1), any_owner=True
        )
    with db.write() as session:
        stacks.open_stack_request(session, job_id, "hang", "hang detection", now + timedelta(seconds=1))
        stacks.open_stack_request(
            session, job_id, "request", "bob", now + timedelta(seconds=2.5), any_owner=True
        )
    with db.read() as session:
        assert session.scalar(select(func.count()).select_from(StackRequest)) == 3


def test_only_the_newest_requests_of_a_job_are_kept_with_their_dumps(db):
    job_id = running_job(db)
    start = utcnow()
    with db.write() as session:
        ids = [
            stacks.open_stack_request(
                session, job_id, "request", "ann", start + timedelta(seconds=3 * i), any_owner=True
            ).request_id
            for i in range(stacks.KEPT_PER_JOB + 5)
        ]
    with db.read() as session:
        kept = set(session.scalars(select(StackRequest.id)).all())
        assert kept == set(ids[5:])
        assert set(session.scalars(select(StackDump.request_id)).all()) == kept
        assert stacks.read_stack_request(session, job_id).id == ids[-1]


def test_a_dump_over_the_bound_is_cut_by_the_coordinator(db):
    job_id = running_job(db)
    with db.write() as session:
        opened = stacks.open_stack_request(session, job_id, "request", "ann", any_owner=True)
    huge = SLEEPING + "x" * (4 * MAX_STACK_BYTES)
    answer(db, opened, {0: huge, 1: SLEEPING})
    with db.read() as session:
        dump = stacks.read_stack_request(session, job_id, opened.request_id).dumps[0]
        assert len(dump.text.encode()) <= MAX_STACK_BYTES
        assert dump.text.endswith("(cut at 256 KiB by the coordinator)\n")
        assert dump.in_collective is False  # read from what was kept: worker 1's sleeping main thread

"""A page of a job's log: the newest `tail` lines, or the lines after a cursor, of one task or attempt or
of all; the cursor to ask from next; and whether the job has ended (a follow stops soon after).

Redraws (a `\\r` progress bar, worker_agent/output_lines.py): a line with `redraw` is a newer state of the
line before it of the same task and stream, and replaces it. The newest `tail` leave out the states a newer
one replaced (unless asked for them), so a reader sees each line as it stands, and no line on such a page
is a redraw (what it replaced is not there); lines after a cursor are every line, so a follower can show a
line move: the first redraw to come replaces the state the newest-`tail` page showed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from mwms.server.services.job_life import jobs
from mwms.server.services.observing import telemetry
from mwms.server.states import JobState

# How many lines a follow reads per poll.
FOLLOW_BATCH = 1000


@dataclass(frozen=True)
class LogEntry:
    """One log line with the task and attempt that wrote it; `id` is its cursor."""

    id: int
    task: int
    attempt: int
    seq: int
    stream: str
    text: str
    at: datetime
    redraw: bool = False


@dataclass(frozen=True)
class LogLines:
    """The lines of one page, in arrival order; `next_after` is the cursor for the next page (the last
    line's id, or the cursor asked with when there are none)."""

    lines: list[LogEntry]
    next_after: int
    job_ended: bool


def read_log_page(
    session: Session,
    job_id: str,
    *,
    task: int | None,
    attempt: int | None,
    after: int,
    tail: int,
    replaced: bool = False,
) -> LogLines:
    """Lines of job `job_id`: after the cursor `after` (oldest first, at most `tail`, every line), else its
    newest `tail` (without the states a redraw replaced, unless `replaced`); NotFound for a job, task
    index or attempt it does not have."""
    job = jobs.get_job(session, job_id)
    jobs.check_task_and_attempt(job, task, attempt)
    # After a cursor a follower needs every state: leaving some out would make a redraw replace a line
    # it is not a state of.
    every_state = replaced or bool(after)
    rows = telemetry.read_logs(
        session, job, task_index=task, attempt=attempt, after=after, tail=tail, superseded=every_state
    )
    lines = [
        LogEntry(
            id=line.id,
            task=t.index,
            attempt=t.attempt_number,
            seq=line.seq,
            stream=line.stream,
            text=line.text,
            at=line.at,
            # Without the replaced states a redraw's predecessor is not on the page: it is a line here.
            redraw=every_state and line.replaces_seq is not None,
        )
        for line, t in rows
    ]
    return LogLines(
        lines=lines, next_after=lines[-1].id if lines else after, job_ended=JobState(job.state).terminal
    )

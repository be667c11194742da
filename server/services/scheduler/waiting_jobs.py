"""The waiting jobs the scheduler plans with, kept between passes: only jobs that changed are read again.

With thousands of waiting jobs, reading every one on every pass is most of a pass. Every change that
matters to planning goes with a job event (server/services/job_life/transitions.py records one per state change;
a priority change records one too), so a pass reads the events since the last one and re-reads only
their jobs. Holds and reasons are written by the scheduler itself: holds are read again every pass (few
jobs have one), reasons are updated in place when a pass writes them. Against anything missed (events of
transactions that commit out of id order on PostgreSQL), the last REREAD_EVENTS events are looked at
again every pass there; when the count of waiting jobs or the sum of their priorities is not what the cache
holds, or every FULL_READ_S seconds, or after a gap in the events, everything is read afresh.

It also carries the pass's memos of the agents' capacities and of the running jobs (agents_memo,
running_memo): those rows are read every pass, and what was built from them is kept by the exact values
read, so nothing there can go stale; only the parsing and building of unchanged rows is saved.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from mwms.server.db.models import Job, JobEvent
from mwms.server.services.scheduler import fair_share
from mwms.server.services.scheduler.placement import AgentCapacity
from mwms.server.services.scheduler.plan_parts import RunningJob
from mwms.server.services.scheduler.queue_order import TeamRuns, WaitingJob
from mwms.server.services.scheduler.scheduling import WAITING_STATES, hold_of, read_holds, read_waiting

FULL_READ_S = 600.0
REREAD_EVENTS = 200
# Fair share's usage (server/services/scheduler/fair_share.py) is read again at most this often: it decays over hours
# and grows by the second, and each new value would make a pass order 10,000 jobs again.
HISTORY_READ_S = 30.0


class WaitingJobs:
    """One coordinator's cache of waiting jobs; `read` is called from the scheduler loop only."""

    def __init__(self, full_read_s: float = FULL_READ_S) -> None:
        self._jobs: dict[str, WaitingJob] = {}
        self._last_event = 0
        self._full_at: datetime | None = None
        self._full_read = timedelta(seconds=full_read_s)
        # Changes whenever a waiting job, a hold or the set of waiting jobs changes (read() sets it); not
        # for the events of other jobs (a placed gang's tasks starting): those made every pass plan again.
        self.version: Hashable = None
        self._revision = 0  # counts the re-reads that changed a waiting job
        self._seen_events: set[int] = set()  # the ids of the last window's events (PostgreSQL)
        # The inputs key of the last pass when it decided nothing (server/services/scheduler/scheduling.py).
        self.quiet_key: Hashable = None
        # The queue order of the last pass, with the inputs it was made from (pass_inputs._ordered).
        self.order: tuple[Hashable, list[WaitingJob]] | None = None
        self.team_runs: TeamRuns = {}  # queue_order's memo: each team's run, by what it was built from
        self._history: tuple[datetime, fair_share.PerTeam] | None = None
        self._held: set[str] = set()  # jobs the cache holds with a hold
        self._priorities: int | None = None  # the sum of the cached jobs' priorities; None: sum again
        # What the pass built from the agents' and the running jobs' rows, by the exact values it was built
        # from (agent_capacity.capacities, job_rows.read_running): rows read again each pass, and the same
        # as last pass, are not parsed again.
        self.agents_memo: dict[str, tuple[Any, AgentCapacity]] = {}  # agent id -> (its values, capacity)
        self.running_memo: dict[Any, RunningJob] = {}

    def history(self, session: Session, now: datetime) -> fair_share.PerTeam:
        """The teams' fair-share usage (fair_share.read_history), read again every HISTORY_READ_S."""
        if self._history is None or not (0 <= (now - self._history[0]).total_seconds() < HISTORY_READ_S):
            self._history = (now, fair_share.read_history(session, now))
        return self._history[1]

    def read(self, session: Session, now: datetime) -> list[WaitingJob]:
        """The waiting jobs as of `session`, holds as of now."""
        newest = session.scalar(select(func.max(JobEvent.id))) or 0
        stale = self._full_at is None or now - self._full_at >= self._full_read or newest < self._last_event
        if stale:
            self._jobs = {job.job_id: job for job in read_waiting(session, now)}
            self._full_at, self._last_event, self._priorities = now, newest, None
            self._seen_events = set()  # the next pass reads the window's jobs again, as before
            return self._current()
        # SQLite has one writer, so events commit in id order and none can appear behind the newest seen.
        window = 0 if session.get_bind().dialect.name == "sqlite" else REREAD_EVENTS
        events = session.execute(
            select(JobEvent.id, JobEvent.job_id).where(JobEvent.id > max(0, self._last_event - window))
        ).all()
        # Only events not seen before: the window's other events were read with their jobs already.
        changed = {job_id for event_id, job_id in events if event_id not in self._seen_events}
        self._seen_events = {event_id for event_id, _ in events}
        if changed:
            before = {job_id: self._jobs.pop(job_id, None) for job_id in changed}
            after = {job.job_id: job for job in read_waiting(session, now, changed)}
            self._jobs.update(after)
            if any(_differs(before[job_id], after.get(job_id)) for job_id in changed):
                self._revision += 1
        self._last_event = newest
        count, priorities = session.execute(
            select(func.count(), func.coalesce(func.sum(Job.priority), 0)).where(
                Job.state.in_(WAITING_STATES)
            )
        ).one()
        if changed or self._priorities is None:
            self._priorities = sum(j.priority for j in self._jobs.values())
        if (count, priorities) != (len(self._jobs), self._priorities):
            # Something changed without an event the cache saw: read them all.
            self._jobs = {job.job_id: job for job in read_waiting(session, now)}
            self._full_at, self._priorities = now, None
            return self._current()
        holds = read_holds(session, now)
        for job_id in set(holds) | self._held:  # a hold given, changed or ended
            job = self._jobs.get(job_id)
            hold = hold_of(holds.get(job_id))
            if job is not None and hold != job.hold:
                self._jobs[job_id] = replace(job, hold=hold)
        return self._current()

    def _current(self) -> list[WaitingJob]:
        jobs = list(self._jobs.values())
        held = tuple(sorted((j.job_id, tuple(sorted(j.hold.items()))) for j in jobs if j.hold))
        self._held = {job_id for job_id, _ in held}
        self.version = (self._revision, len(jobs), self._full_at, held)
        return jobs


def _differs(before: WaitingJob | None, after: WaitingJob | None) -> bool:
    """Whether a job's event changed what a pass plans with (or its reason, written by someone else)."""
    if before is None or after is None:
        return before is not after
    return before != after or before.stored_reason != after.stored_reason

"""Stack dumps of an attempt's tasks: opening a request, storing what the agents answer, reading it back.

A request (StackRequest) is opened for the job's current attempt while its tasks run; it holds one row
per task asked (StackDump), first as a placeholder that says no answer has come, then the agent's
answer with whether the task waits in a TensorFlow collective (server/services/observing/stack_text.py).
Sending the command and waiting for the answers is the transport's part (server/live/stack_collector.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, selectinload

from mwms.server.db.models import Agent, StackDump, StackRequest, utcnow
from mwms.server.errors import Conflict, NotFound
from mwms.server.limits import TooManyRequests
from mwms.server.services.auth.job_owners import check_job_owner
from mwms.server.services.job_life.jobs import current_attempt, get_job
from mwms.server.services.observing.stack_text import dump_in_collective, main_thread_frame, read_dump
from mwms.server.states import AttemptState, JobState, TaskState
from mwms.stack_dumps import bounded

CAUSES = ("request", "hang")
# Dumps on request pause every task of a job (py-spy) or make it write its stacks (faulthandler) and store up
# to 256 KiB per task: one per job every this many seconds, and only the newest KEPT_PER_JOB per job are kept.
MIN_REQUEST_INTERVAL_S = 2.0
KEPT_PER_JOB = 20
MAX_ERROR_CHARS = 2000
# A placeholder's error, until the agent answers; an agent's own errors never start like this.
NO_ANSWER_PREFIX = "no answer from agent"


@dataclass(frozen=True)
class DumpAsked:
    """One task whose stacks were asked of its agent."""

    task_id: str
    task_index: int
    agent_id: str


@dataclass(frozen=True)
class OpenedRequest:
    request_id: str
    job_id: str
    attempt: int
    asked: list[DumpAsked]


@dataclass(frozen=True)
class IncomingStackDump:
    """A StackDump message from an agent, as the services see it."""

    request_id: str
    task_id: str
    pid: int
    method: str
    text: str
    error: str


def open_stack_request(
    session: Session,
    job_id: str,
    cause: str,
    requested_by: str,
    now: datetime | None = None,
    *,
    any_owner: bool = False,
) -> OpenedRequest:
    """A new request for the stacks of every running task of the job's current attempt.

    A dump on request pauses the job's tasks, so it goes through the owner check that cancel does: only
    the user who submitted the job (`requested_by`), or an admin (`any_owner`), may ask; hang detection
    is the coordinator's own. Conflict when the job has no attempt whose tasks run (pending, finished,
    or still starting).
    """
    if cause not in CAUSES:
        raise ValueError(f"cause must be one of {CAUSES}, not {cause!r}")
    now = now or utcnow()
    job = get_job(session, job_id)
    if cause == "request":
        check_job_owner(job, requested_by, any_owner, "dump its stacks (which pauses its tasks)")
    attempt = current_attempt(job)
    running = (
        [t for t in attempt.tasks if t.state == TaskState.RUNNING.value]
        if attempt is not None and attempt.state == AttemptState.ACTIVE.value
        else []
    )
    if JobState(job.state) not in (JobState.SCHEDULED, JobState.RUNNING) or attempt is None or not running:
        raise Conflict(
            f"job {job.id} is {job.state} and has no running attempt: stacks can be dumped only while its "
            "tasks run (see `mwms status` for its state)"
        )
    if cause == "request":
        _refuse_a_second_request_too_soon(session, job.id, now)
    request = StackRequest(
        job_id=job.id, attempt=attempt.number, cause=cause, requested_by=requested_by, requested_at=now
    )
    session.add(request)
    session.flush()
    _forget_all_but_the_newest(session, job.id)
    names = _agent_names(session, [t.agent_id for t in running])
    for task in running:
        session.add(
            StackDump(
                request_id=request.id,
                task_id=task.id,
                task_index=task.index,
                agent_id=task.agent_id,
                pid=task.pid,
                error=f"{NO_ANSWER_PREFIX} {names.get(task.agent_id, task.agent_id)} yet",
                received_at=now,
            )
        )
    session.flush()
    asked = [DumpAsked(t.id, t.index, t.agent_id) for t in running]
    return OpenedRequest(request.id, job.id, attempt.number, asked)


def _refuse_a_second_request_too_soon(session: Session, job_id: str, now: datetime) -> None:
    """One requested dump per job every MIN_REQUEST_INTERVAL_S, counted from when the last one ended (its
    latest answer): a dump of several snapshots takes about a second itself."""
    last = session.execute(
        select(StackRequest.id, StackRequest.requested_at)
        .where(StackRequest.job_id == job_id, StackRequest.cause == "request")
        .order_by(StackRequest.requested_at.desc())
        .limit(1)
    ).first()
    if last is None:
        return
    answered = session.scalar(select(func.max(StackDump.received_at)).where(StackDump.request_id == last.id))
    ended = max(last.requested_at, answered) if answered is not None else last.requested_at
    if now - ended < timedelta(seconds=MIN_REQUEST_INTERVAL_S):
        raise TooManyRequests(
            f"the stacks of job {job_id} were dumped {max(0.0, (now - ended).total_seconds()):.1f} s ago: one "
            f"dump per job every {MIN_REQUEST_INTERVAL_S:g} s; GET /api/v1/jobs/{job_id}/stacks shows the last one"
        )


def _forget_all_but_the_newest(session: Session, job_id: str) -> None:
    kept = (
        select(StackRequest.id)
        .where(StackRequest.job_id == job_id)
        .order_by(StackRequest.requested_at.desc(), StackRequest.id.desc())
        .limit(KEPT_PER_JOB)
    )
    old = session.scalars(
        select(StackRequest.id).where(StackRequest.job_id == job_id, StackRequest.id.not_in(kept))
    ).all()
    if old:
        session.execute(delete(StackDump).where(StackDump.request_id.in_(old)))
        session.execute(delete(StackRequest).where(StackRequest.id.in_(old)))


def mark_unreachable(session: Session, request_id: str, task_ids: Sequence[str], why: str) -> None:
    """Tasks whose agent could not be asked (no live session): their rows say why."""
    for dump in _dumps(session, request_id, task_ids):
        dump.error = f"{NO_ANSWER_PREFIX}: {why}"


def store_stack_dump(session: Session, agent_id: str, incoming: IncomingStackDump) -> bool:
    """Stores an agent's answer in its placeholder; False when it answers nothing asked of this agent."""
    dump = session.scalars(
        select(StackDump).where(
            StackDump.request_id == incoming.request_id, StackDump.task_id == incoming.task_id
        )
    ).one_or_none()
    if dump is None or dump.agent_id != agent_id:
        return False
    dump.pid = incoming.pid or dump.pid
    dump.method = incoming.method[:20]
    dump.text = bounded(incoming.text, "the coordinator")  # an agent that does not bound it is held to it
    error = incoming.error[:MAX_ERROR_CHARS]
    dump.error = error if error or incoming.text else "the agent sent an empty dump"
    dump.in_collective = dump_in_collective(dump.text) if dump.text else None
    dump.received_at = utcnow()
    session.flush()
    return True


def answered(dump: StackDump) -> bool:
    return not dump.error.startswith(NO_ANSWER_PREFIX)


def answered_task_ids(session: Session, request_id: str) -> set[str]:
    """The tasks of the request whose answers are stored (by whichever replica holds their agents)."""
    rows = session.execute(
        select(StackDump.task_id, StackDump.error).where(StackDump.request_id == request_id)
    ).all()
    return {task_id for task_id, error in rows if not (error or "").startswith(NO_ANSWER_PREFIX)}


def unanswered_by_agent(session: Session, request_id: str, agent_ids: set[str]) -> dict[str, list[str]]:
    """For a request another replica opened: the tasks still unanswered on agents in `agent_ids` (those
    whose streams this replica holds), by agent."""
    rows = session.execute(
        select(StackDump.agent_id, StackDump.task_id, StackDump.error).where(
            StackDump.request_id == request_id
        )
    ).all()
    by_agent: dict[str, list[str]] = {}
    for agent_id, task_id, error in rows:
        if agent_id in agent_ids and (error or "").startswith(NO_ANSWER_PREFIX):
            by_agent.setdefault(agent_id, []).append(task_id)
    return by_agent


def count_answered(session: Session, request_id: str) -> int:
    dumps = session.scalars(select(StackDump).where(StackDump.request_id == request_id)).all()
    return sum(1 for d in dumps if answered(d))


def latest_request_id(session: Session, job_id: str) -> str | None:
    """The id of the job's newest stack request (what GET /api/v1/jobs/{id}/stacks shows); None: none yet."""
    return session.scalars(
        select(StackRequest.id)
        .where(StackRequest.job_id == job_id)
        .order_by(StackRequest.requested_at.desc(), StackRequest.id.desc())
        .limit(1)
    ).first()


def read_stack_request(session: Session, job_id: str, request_id: str | None = None) -> StackRequest:
    """A job's newest stack request (or the one named) with its dumps, ordered by task index."""
    job = get_job(session, job_id)
    query = (
        select(StackRequest).options(selectinload(StackRequest.dumps)).where(StackRequest.job_id == job.id)
    )
    if request_id is not None:
        found = session.scalars(query.where(StackRequest.id == request_id)).one_or_none()
        if found is None:
            raise NotFound(
                f"job {job.id} has no stack dump {request_id}; GET /api/v1/jobs/{job.id}/stacks shows the latest"
            )
        return found
    latest = session.scalars(
        query.order_by(StackRequest.requested_at.desc(), StackRequest.id.desc()).limit(1)
    ).first()
    if latest is None:
        raise NotFound(
            f"no stacks of job {job.id} were dumped yet: take them with POST /api/v1/jobs/{job.id}/stacks "
            f"or `mwms stacks {job.id}`"
        )
    return latest


def agent_names(session: Session, request: StackRequest) -> dict[str, str]:
    """The names of the agents of a request's dumps, in one query."""
    return _agent_names(session, [d.agent_id for d in request.dumps])


def describe_workers_outside_collectives(session: Session, request_id: str) -> str:
    """For a hang's reason: which workers do not wait in a collective, and where they are."""
    request = session.get(StackRequest, request_id)
    if request is None or not request.dumps:
        return "no stacks could be taken"
    names = agent_names(session, request)
    outside, unknown = [], []
    for dump in request.dumps:
        worker = f"worker {dump.task_index} on agent {names.get(dump.agent_id, dump.agent_id)}"
        if dump.in_collective is None:
            unknown.append(f"{worker} ({dump.error or 'no stacks'})")
        elif not dump.in_collective:
            reading = read_dump(dump.text)
            where = main_thread_frame(reading.threads)
            details = f"pid {dump.pid}" + (f", in {where}" if where else "")
            if reading.snapshots > 1:
                details += f", outside a collective in all {reading.snapshots} snapshots"
            outside.append(f"{worker} ({details})")
    parts = []
    if outside:
        parts.append("not in a collective: " + "; ".join(outside))
    if unknown:
        parts.append("no stacks from " + "; ".join(unknown))
    return ". ".join(parts) if parts else "every worker waits in a collective"


def _dumps(session: Session, request_id: str, task_ids: Sequence[str]) -> list[StackDump]:
    if not task_ids:
        return []
    return list(
        session.scalars(
            select(StackDump).where(StackDump.request_id == request_id, StackDump.task_id.in_(list(task_ids)))
        ).all()
    )


def _agent_names(session: Session, agent_ids: Sequence[str]) -> dict[str, str]:
    ids = sorted(set(agent_ids))
    if not ids:
        return {}
    return {
        agent_id: name
        for agent_id, name in session.execute(select(Agent.id, Agent.name).where(Agent.id.in_(ids)))
    }

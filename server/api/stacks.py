"""/api/v1/jobs/{id}/stacks: take the Python stacks of a running job's tasks now, or read the latest."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy.orm import Session

from server.api.auth import Caller
from server.api.deps import ReadSession, WiringDep
from server.db.models import StackRequest
from server.schemas import ErrorOut, StackDumpsOut, StackThreadOut, TaskStacksOut, ValidationErrorOut
from server.services import stacks
from server.services.stack_text import parse_threads
from server.services.tokens import Role

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut},
    403: {"model": ErrorOut},
    404: {"model": ErrorOut},
    409: {"model": ErrorOut, "description": "the job has no running attempt"},
    429: {"model": ErrorOut, "description": "the job's stacks were dumped less than 2 s ago"},
    422: {"model": ValidationErrorOut},
}
# How long a request waits for the agents' answers; the ones that come later are stored all the same.
ANSWER_WAIT_S = 10.0


def stack_dumps_out(session: Session, request: StackRequest) -> StackDumpsOut:
    names = stacks.agent_names(session, request)
    tasks = []
    for dump in request.dumps:
        threads = parse_threads(dump.text)
        tasks.append(
            TaskStacksOut(
                task_index=dump.task_index,
                task_id=dump.task_id,
                agent_id=dump.agent_id,
                agent_name=names.get(dump.agent_id, ""),
                pid=dump.pid,
                method=dump.method,
                answered=stacks.answered(dump),
                error=dump.error,
                in_collective=dump.in_collective,
                received_at=dump.received_at,
                threads=[
                    StackThreadOut(title=t.title, frames=t.frames, in_collective=t.in_collective)
                    for t in threads
                ],
                text=dump.text,
            )
        )
    return StackDumpsOut(
        id=request.id,
        job_id=request.job_id,
        attempt=request.attempt,
        cause=request.cause,
        requested_by=request.requested_by,
        requested_at=request.requested_at,
        complete=all(t.answered for t in tasks),
        tasks=tasks,
    )


@router.post("/{job_id}/stacks", response_model=StackDumpsOut, responses=ERRORS)
async def dump_stacks(job_id: str, wiring: WiringDep, caller: Caller) -> StackDumpsOut:
    """Takes the Python stacks of every running task of the job's current attempt at the same moment and
    returns what arrived within 10 s (tasks whose agent did not answer are marked). Stored with the attempt;
    one dump per job every 2 s (429 sooner), and the newest 20 of a job are kept. It pauses the tasks, so
    as with cancel, users may dump the stacks of their own jobs, admins of any (403 otherwise)."""
    opened = await wiring.stacks.collect(
        job_id, "request", caller.user, ANSWER_WAIT_S, any_owner=caller.may(Role.ADMIN)
    )

    def read() -> StackDumpsOut:
        with wiring.db.read() as session:
            return stack_dumps_out(session, stacks.read_stack_request(session, job_id, opened.request_id))

    return await asyncio.to_thread(read)


@router.get("/{job_id}/stacks", response_model=StackDumpsOut, responses=ERRORS)
def latest_stacks(
    job_id: str,
    session: ReadSession,
    request_id: Annotated[
        str | None, Query(alias="request", max_length=32, description="a dump's id; default: the newest")
    ] = None,
) -> StackDumpsOut:
    """The job's newest stack dump (on request or by hang detection), or the one named."""
    return stack_dumps_out(session, stacks.read_stack_request(session, job_id, request_id))

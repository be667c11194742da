"""/api/v1/jobs/{id}/stacks: take the Python stacks of a running job's tasks now, or read the latest."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query

from mwms.server.api.auth import Caller
from mwms.server.api.deps import ReadSession, WiringDep
from mwms.server.schemas import ErrorOut, StackDumpsOut, StackThreadOut, TaskStacksOut, ValidationErrorOut
from mwms.server.services import views
from mwms.server.services.auth.tokens import Role
from mwms.server.services.views import StackDumpsView

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


def stack_dumps_out(view: StackDumpsView) -> StackDumpsOut:
    request = view.request
    return StackDumpsOut(
        id=request.id,
        job_id=request.job_id,
        attempt=request.attempt,
        cause=request.cause,
        requested_by=request.requested_by,
        requested_at=request.requested_at,
        complete=view.complete,
        tasks=[
            TaskStacksOut(
                task_index=t.dump.task_index,
                task_id=t.dump.task_id,
                agent_id=t.dump.agent_id,
                agent_name=t.agent_name,
                pid=t.dump.pid,
                method=t.dump.method,
                answered=t.answered,
                error=t.dump.error,
                in_collective=t.dump.in_collective,
                snapshots=t.reading.snapshots,
                snapshots_in_collective=t.reading.snapshots_in_collective,
                received_at=t.dump.received_at,
                threads=[
                    StackThreadOut(
                        title=thread.title, frames=thread.frames, in_collective=thread.in_collective
                    )
                    for thread in t.reading.threads
                ],
                text=t.dump.text,
            )
            for t in view.tasks
        ],
    )


@router.post("/{job_id}/stacks", response_model=StackDumpsOut, responses=ERRORS)
async def dump_stacks(job_id: str, wiring: WiringDep, caller: Caller) -> StackDumpsOut:
    """Takes the Python stacks of every running task of the job's current attempt at the same moment, 3
    snapshots over about a second (a worker is not in a collective only when outside one in all), and
    returns what arrived within 10 s (tasks whose agent did not answer are marked). Stored with the attempt;
    one dump per job every 2 s (429 sooner), and the newest 20 of a job are kept. It pauses the tasks, so
    as with cancel, users may dump the stacks of their own jobs, admins of any (403 otherwise)."""
    opened = await wiring.stacks.collect(
        job_id, "request", caller.user, ANSWER_WAIT_S, any_owner=caller.may(Role.ADMIN)
    )

    def read() -> StackDumpsOut:
        with wiring.db.read() as session:
            return stack_dumps_out(views.read_stacks_view(session, job_id, opened.request_id))

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
    return stack_dumps_out(views.read_stacks_view(session, job_id, request_id))

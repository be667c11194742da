"""/api/v1/jobs: create, list, inspect, cancel; logs, metrics and artifacts of a job."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, StreamingResponse

from server.api.auth import Caller
from server.api.deps import ReadSession, RuntimeDep
from server.api.views import artifact_out, job_out, job_summary
from server.errors import NotFound
from server.schemas import (
    ArtifactOut,
    ErrorOut,
    JobCreate,
    JobOut,
    JobPage,
    LogLineOut,
    LogPage,
    MetricPointOut,
    MetricSeries,
)
from server.services import files, jobs, telemetry
from server.services.tokens import Role
from server.states import JobState

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut},
    401: {"model": ErrorOut},
    403: {"model": ErrorOut},
    404: {"model": ErrorOut},
    409: {"model": ErrorOut},
    422: {"model": ErrorOut},
}


@router.post("", status_code=201, response_model=JobOut, responses=ERRORS)
def create_job(spec: JobCreate, rt: RuntimeDep, caller: Caller) -> JobOut:
    """Submits a job as the caller; it starts PENDING and is gang-placed when every worker fits."""
    with rt.db.write() as session:
        out = job_out(session, jobs.create_job(session, spec, submitted_by=caller.user))
    rt.poke_scheduler()
    return out


@router.get("", response_model=JobPage)
def list_jobs(
    session: ReadSession,
    state: Annotated[list[JobState] | None, Query(description="filter; repeat for several")] = None,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> JobPage:
    """Jobs, newest first."""
    rows, total = jobs.list_jobs(session, state or [], offset, limit)
    return JobPage(jobs=[job_summary(session, j) for j in rows], total=total, offset=offset, limit=limit)


@router.get("/{job_id}", response_model=JobOut, responses=ERRORS)
def get_job(job_id: str, session: ReadSession) -> JobOut:
    """A job with its tasks, attempts and state history."""
    return job_out(session, jobs.get_job(session, job_id))


@router.post("/{job_id}/cancel", response_model=JobOut, responses=ERRORS)
def cancel_job(job_id: str, rt: RuntimeDep, caller: Caller) -> JobOut:
    """Cancels the job and stops every task it runs; users may cancel their own jobs, admins any."""
    with rt.db.write() as session:
        job = jobs.cancel_job(session, job_id, by=caller.user, any_owner=caller.may(Role.ADMIN))
        out = job_out(session, job)
    rt.wake_agents(None)
    return out


@router.get("/{job_id}/logs", response_model=LogPage, responses=ERRORS)
async def job_logs(
    job_id: str,
    request: Request,
    rt: RuntimeDep,
    task: Annotated[int | None, Query(ge=0, description="task index; all tasks when absent")] = None,
    attempt: Annotated[int | None, Query(ge=1)] = None,
    tail: Annotated[int, Query(ge=1, le=10000)] = 1000,
    after: Annotated[int, Query(ge=0, description="only lines newer than this cursor")] = 0,
    follow: bool = False,
) -> LogPage | StreamingResponse:
    """Log lines (tail, or after a cursor). With follow=true: NDJSON lines until the job has finished."""

    def page(cursor: int, limit: int) -> tuple[list[LogLineOut], bool]:
        with rt.db.read() as session:
            job = jobs.get_job(session, job_id)
            jobs.check_task_and_attempt(job, task, attempt)
            rows = telemetry.read_logs(
                session, job, task_index=task, attempt=attempt, after=cursor, tail=limit
            )
            lines = [
                LogLineOut(
                    id=line.id,
                    task=t.index,
                    attempt=t.attempt_number,
                    seq=line.seq,
                    stream=line.stream,
                    text=line.text,
                    at=line.at,
                )
                for line, t in rows
            ]
            return lines, JobState(job.state).terminal

    lines, _ = await asyncio.to_thread(page, after, tail)
    if not follow:
        return LogPage(lines=lines, next_after=lines[-1].id if lines else after)

    async def stream() -> AsyncIterator[bytes]:
        cursor = lines[-1].id if lines else after
        for line in lines:
            yield (line.model_dump_json() + "\n").encode()
        finished_seen = 0
        while not await request.is_disconnected():
            batch, finished = await asyncio.to_thread(page, cursor, 1000)
            for line in batch:
                yield (line.model_dump_json() + "\n").encode()
            if batch:
                cursor = batch[-1].id
                continue
            # After the job ends, give the agents a moment to deliver their last lines.
            finished_seen = finished_seen + 1 if finished else 0
            if finished_seen >= 4:
                return
            await asyncio.sleep(0.5)

    return StreamingResponse(stream(), media_type="application/x-ndjson")


@router.get("/{job_id}/metrics", response_model=MetricSeries, responses=ERRORS)
def job_metrics(
    job_id: str,
    session: ReadSession,
    name: str | None = None,
    min_step: int | None = None,
    max_step: int | None = None,
    attempt: Annotated[int | None, Query(ge=1)] = None,
) -> MetricSeries:
    """The chief's reduced metric series: name, step, value, wall time and attempt of every point."""
    job = jobs.get_job(session, job_id)
    jobs.check_task_and_attempt(job, None, attempt)
    points = telemetry.read_metrics(
        session, job, name=name, min_step=min_step, max_step=max_step, attempt=attempt
    )
    return MetricSeries(
        points=[
            MetricPointOut(name=p.name, step=p.step, value=p.value if p.value is not None else float("nan"), wall_time=p.wall_time, attempt=p.attempt)
            for p in points
        ]
    )


@router.get("/{job_id}/artifacts", response_model=list[ArtifactOut], responses=ERRORS)
def job_artifacts(job_id: str, session: ReadSession) -> list[ArtifactOut]:
    """Files the chief left in MWMS_OUTPUT_DIR, per attempt."""
    return [artifact_out(r) for r in files.list_artifacts(session, jobs.get_job(session, job_id))]


@router.get("/{job_id}/artifacts/{path:path}", response_class=FileResponse, responses=ERRORS)
def job_artifact(
    job_id: str, path: str, session: ReadSession, rt: RuntimeDep, attempt: int | None = None
) -> FileResponse:
    """One artifact file (the newest attempt's unless ?attempt= is given)."""
    job = jobs.get_job(session, job_id)
    location = files.artifact_file(session, rt.settings.files_dir, job, path, attempt)
    if not location.is_file():
        raise NotFound(f"artifact {path!r} of job {job_id} is recorded but its file is missing")
    return FileResponse(location, filename=location.name, media_type="application/octet-stream")

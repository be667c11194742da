"""/api/v1/jobs: create, list, inspect, cancel; logs, metrics and artifacts of a job."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import FileResponse, StreamingResponse
from pydantic import TypeAdapter
from starlette.background import BackgroundTask

from mwms.server.api.auth import Caller
from mwms.server.api.deps import ReadSession, Views, WiringDep
from mwms.server.api.views import artifact_out, job_listing_out, job_out, log_line_out
from mwms.server.errors import NotFound
from mwms.server.limits import INT64_MAX, INT64_MIN, MAX_NAME_CHARS, MAX_WORKERS, SpecLimits, check_job_spec
from mwms.server.live.wiring import Wiring
from mwms.server.schemas import (
    ArtifactOut,
    ErrorOut,
    JobCreate,
    JobOut,
    JobPage,
    LogLineOut,
    LogPage,
    MetricPointOut,
    MetricSeries,
    PriorityChange,
    ValidationErrorOut,
)
from mwms.server.services import views
from mwms.server.services.auth.tokens import Principal, Role
from mwms.server.services.job_life import idempotency, jobs
from mwms.server.services.observing import log_pages, telemetry
from mwms.server.services.observing.follows import FollowSlots, follow_lines
from mwms.server.services.storage import files
from mwms.server.states import JobState

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut},
    401: {"model": ErrorOut},
    403: {"model": ErrorOut},
    404: {"model": ErrorOut},
    409: {"model": ErrorOut},
    422: {"model": ValidationErrorOut},
}
FOLLOW_BUSY: dict[int | str, dict[str, Any]] = {
    429: {"model": ErrorOut, "description": "too many log follows open (per user or in all)"}
}
BODY_TOO_LARGE: dict[int | str, dict[str, Any]] = {
    413: {"model": ErrorOut, "description": "the body is over MWMS_MAX_REQUEST_BODY_BYTES"}
}
FOLLOWED_LINES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "a page of lines; with follow=true, NDJSON: one LogLineOut a line",
        "content": {"application/x-ndjson": {"schema": {"$ref": "#/components/schemas/LogLineOut"}}},
    }
}
ARTIFACT_FILE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the file's bytes",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}
Offset = Annotated[int, Query(ge=0, le=INT64_MAX)]
Cursor = Annotated[int, Query(ge=0, le=INT64_MAX, description="only lines newer than this cursor")]
AttemptNumber = Annotated[int | None, Query(ge=1, le=INT64_MAX)]
Step = Annotated[int | None, Query(ge=INT64_MIN, le=INT64_MAX)]


def bounded_spec(spec: JobCreate, wiring: WiringDep) -> JobCreate:
    """The request's job spec, refused (422 naming the limit) when it is over a request limit."""
    check_job_spec(spec, SpecLimits.of(wiring.settings))
    return spec


def submit_policy(caller: Principal, wiring: Wiring) -> jobs.SubmitPolicy:
    """What the caller may ask of a job: admins anything, users up to the coordinator's limits."""
    settings = wiring.settings
    admin = caller.may(Role.ADMIN)
    return jobs.SubmitPolicy(
        priority_ceiling=None if admin else settings.user_priority_ceiling,
        may_opt_out_of_preemption=admin or settings.users_may_opt_out_of_preemption,
        max_preemption_grace_s=settings.max_preemption_grace_s,
        refuse_impossible=True,
    )


def follow_slots(request: Request) -> FollowSlots:
    return request.app.state.follow_slots


def ndjson(lines: Sequence[LogLineOut]) -> bytes:
    return b"".join((line.model_dump_json() + "\n").encode() for line in lines)


@router.post(
    "",
    status_code=201,
    response_model=JobOut,
    responses=ERRORS | BODY_TOO_LARGE | {200: {"model": JobOut, "description": "the job this key created"}},
)
def create_job(
    spec: Annotated[JobCreate, Depends(bounded_spec)],
    wiring: WiringDep,
    caller: Caller,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            max_length=idempotency.IDEMPOTENCY_KEY_MAX_LENGTH,
            pattern=idempotency.IDEMPOTENCY_KEY_PATTERN,
            description="a client-chosen key (letters, digits, . _ : -): resending the same spec with it "
            "returns the job it created (200) instead of a new one; another spec with it is a 409",
        ),
    ] = None,
) -> JobOut:
    """Submits a job as the caller; it starts PENDING and is gang-placed when every worker fits. A job that
    no set of the registered agents could ever hold is refused (409, saying what the cluster has); a
    bundle_digest no uploaded bundle has is a 404, and a rule across fields (see JobCreate) a 422."""
    with wiring.db.write() as session:
        job, created = idempotency.find_or_create_job(
            session, spec, caller.user, idempotency_key, submit_policy(caller, wiring)
        )
        out = job_out(views.job_view(session, job))
    if not created:
        response.status_code = 200
        return out
    wiring.poke_scheduler()
    return out


JOB_PAGE = TypeAdapter(JobPage)


@router.get("", response_model=JobPage)
def list_jobs(
    wiring: WiringDep,
    views: Views,
    state: Annotated[list[JobState] | None, Query(description="filter; repeat for several")] = None,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Response:
    """Jobs, newest first (ties in created_at by id, descending)."""
    states = sorted(set(state or []))

    def build() -> JobPage:
        with wiring.db.read() as session:
            rows, total = jobs.list_jobs(session, states, offset, limit)
            return JobPage(jobs=[job_listing_out(r) for r in rows], total=total, offset=offset, limit=limit)

    return views.json(("jobs", tuple(states), offset, limit), JOB_PAGE, build)


@router.get("/{job_id}", response_model=JobOut, responses=ERRORS)
def get_job(job_id: str, session: ReadSession) -> JobOut:
    """A job with its tasks, attempts and state history."""
    return job_out(views.read_job_view(session, job_id))


@router.post("/{job_id}/cancel", response_model=JobOut, responses=ERRORS)
def cancel_job(job_id: str, wiring: WiringDep, caller: Caller) -> JobOut:
    """Cancels the job and stops every task it runs; users may cancel their own jobs, admins any."""
    with wiring.db.write() as session:
        job = jobs.cancel_job(session, job_id, by=caller.user, any_owner=caller.may(Role.ADMIN))
        out = job_out(views.job_view(session, job))
    wiring.wake_agents(None)
    return out


@router.post("/{job_id}/priority", response_model=JobOut, responses=ERRORS)
def set_priority(job_id: str, change: PriorityChange, wiring: WiringDep, caller: Caller) -> JobOut:
    """Changes a PENDING job's priority: its owner up to MWMS_USER_PRIORITY_CEILING, admins any."""
    with wiring.db.write() as session:
        job = jobs.set_priority(
            session,
            job_id,
            change.priority,
            by=caller.user,
            policy=submit_policy(caller, wiring),
            any_owner=caller.may(Role.ADMIN),
        )
        out = job_out(views.job_view(session, job))
    wiring.poke_scheduler()
    return out


@router.get("/{job_id}/logs", response_model=LogPage, responses=ERRORS | FOLLOW_BUSY | FOLLOWED_LINES)
async def job_logs(
    job_id: str,
    request: Request,
    wiring: WiringDep,
    caller: Caller,
    slots: Annotated[FollowSlots, Depends(follow_slots)],
    task: Annotated[
        int | None, Query(ge=0, le=MAX_WORKERS - 1, description="task index; all tasks when absent")
    ] = None,
    attempt: AttemptNumber = None,
    tail: Annotated[int, Query(ge=1, le=10000)] = 1000,
    after: Cursor = 0,
    follow: bool = False,
    replaced: Annotated[
        bool,
        Query(
            description="with the newest `tail` lines, also the states of a line that a newer one (a "
            "`redraw`) replaced; lines after a cursor always include them"
        ),
    ] = False,
) -> LogPage | StreamingResponse:
    """Log lines (tail, or after a cursor), at most 8 MiB of text a page: fewer than `tail` when they are
    long (the newest that fit, or the first after the cursor). With follow=true: NDJSON lines until the job
    has finished, or until none has come for MWMS_FOLLOW_IDLE_TIMEOUT_S (follow again from the last line's id); at most
    MWMS_MAX_FOLLOWS_PER_USER follows per user and MWMS_MAX_FOLLOWS_TOTAL in all (429 beyond).
    A line with redraw=true replaces the line before it of its task and stream (a progress bar)."""

    def page(cursor: int, limit: int) -> tuple[list[LogLineOut], int, bool]:
        with wiring.db.read() as session:
            found = log_pages.read_log_page(
                session, job_id, task=task, attempt=attempt, after=cursor, tail=limit, replaced=replaced
            )
        return [log_line_out(line) for line in found.lines], found.next_after, found.job_ended

    lines, next_after, _ = await asyncio.to_thread(page, after, tail)
    if not follow:
        return LogPage(lines=lines, next_after=next_after)

    slot = slots.acquire(caller.user)

    async def newer(cursor: int) -> tuple[list[LogLineOut], bool]:
        batch, _, ended = await asyncio.to_thread(page, cursor, log_pages.FOLLOW_BATCH)
        return batch, ended

    async def stream() -> AsyncIterator[bytes]:
        try:
            if lines:
                yield ndjson(lines)
            batches = follow_lines(
                newer,
                next_after,
                request.is_disconnected,
                idle_timeout_s=wiring.settings.follow_idle_timeout_s,
            )
            async for batch in batches:
                yield ndjson(batch)
        finally:
            slot.release()

    return StreamingResponse(
        stream(), media_type="application/x-ndjson", background=BackgroundTask(slot.release)
    )


@router.get("/{job_id}/metrics", response_model=MetricSeries, responses=ERRORS)
def job_metrics(
    job_id: str,
    session: ReadSession,
    name: Annotated[str | None, Query(max_length=MAX_NAME_CHARS)] = None,
    min_step: Step = None,
    max_step: Step = None,
    attempt: AttemptNumber = None,
    after: Annotated[
        int | None,
        Query(
            ge=0,
            le=INT64_MAX,
            description="only the points stored after this cursor (a page's `cursor`), in storage order; "
            "0: from the first",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=telemetry.MAX_METRIC_POINTS_PER_PAGE)] = (
        telemetry.MAX_METRIC_POINTS_PER_PAGE
    ),
) -> MetricSeries:
    """The chief's reduced metric series: name, step, value, wall time and attempt of every point, at
    most `limit` per page, ordered by name, attempt and step. A page that polls reads only what is new:
    `after` the previous page's `cursor`. When `more` is true, read on with after=cursor (or, for a
    first page read without `after`, from after=0)."""
    job = jobs.get_job(session, job_id)
    jobs.check_task_and_attempt(job, None, attempt)
    points, more = telemetry.read_metrics(
        session,
        job,
        name=name,
        min_step=min_step,
        max_step=max_step,
        attempt=attempt,
        after=after,
        limit=limit,
    )
    if after is not None:
        cursor = points[-1].id if points else after
    else:
        cursor = 0 if more else max((p.id for p in points), default=0)
    return MetricSeries(
        cursor=cursor,
        more=more,
        points=[
            MetricPointOut(
                name=p.name,
                step=p.step,
                value=telemetry.value_out(p.value),
                wall_time=p.wall_time,
                attempt=p.attempt,
            )
            for p in points
        ],
    )


@router.get("/{job_id}/artifacts", response_model=list[ArtifactOut], responses=ERRORS)
def job_artifacts(job_id: str, session: ReadSession) -> list[ArtifactOut]:
    """Files the chief left in MWMS_OUTPUT_DIR, per attempt."""
    return [artifact_out(r) for r in files.list_artifacts(session, jobs.get_job(session, job_id))]


@router.get("/{job_id}/artifacts/{path:path}", response_class=FileResponse, responses=ERRORS | ARTIFACT_FILE)
def job_artifact(
    job_id: str, path: str, session: ReadSession, wiring: WiringDep, attempt: AttemptNumber = None
) -> FileResponse:
    """One artifact file (the newest attempt's unless ?attempt= is given)."""
    job = jobs.get_job(session, job_id)
    location = files.artifact_file(session, wiring.settings.files_dir, job, path, attempt)
    if not location.is_file():
        raise NotFound(f"artifact {path!r} of job {job_id} is recorded but its file is missing")
    return FileResponse(location, filename=location.name, media_type="application/octet-stream")

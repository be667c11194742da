"""The fake API's job routes: submit, list, details, cancel, logs (also followed as NDJSON), metrics,
artifacts, stack dumps, devices and preflight results, each answering the coordinator's response model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from hashlib import sha256
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.responses import StreamingResponse

from mwms.server import schemas
from mwms_testkit.fake_api.auth import State
from mwms_testkit.fake_api.fake_job import ENDED_STATES, T0, FakeJob, _iso, now
from mwms_testkit.fake_api.scripted_job import ScriptedJob

router = APIRouter(prefix="/api/v1/jobs")
BINARY = {"type": "string", "format": "binary"}


@router.post("", status_code=201, response_model=schemas.JobOut)
def submit(spec: schemas.JobCreate, request: Request, state: State) -> Any:
    state.idempotency_keys.append(request.headers.get("idempotency-key"))
    if spec.bundle_digest not in state.bundles:
        raise HTTPException(404, f"unknown bundle digest {spec.bundle_digest[:12]}; upload it first")
    with state.lock:
        job_id = f"job{len(state.jobs) + 1:04d}"
        state.jobs[job_id] = ScriptedJob.submitted(job_id, spec, request.state.token["user"])
        return state.jobs[job_id].detail()


@router.get("", response_model=schemas.JobPage)
def list_jobs(
    state: State,
    states: Annotated[list[str] | None, Query(alias="state")] = None,
    offset: int = 0,
    limit: int = 50,
) -> Any:
    with state.lock:
        for job in state.jobs.values():
            _advance_when_listed(job)
        everything = [] if state.empty else list(reversed(state.jobs.values()))
        selected = [job for job in everything if not states or job.state in states]
        selected.sort(key=lambda job: job.created_at, reverse=True)
        page = [job.summary() for job in selected[offset : offset + limit]]
    return {"jobs": page, "total": len(selected), "offset": offset, "limit": limit}


def _advance_when_listed(job: FakeJob) -> None:
    job.polls += 1
    if job.finish_after_polls is not None and job.state == "RUNNING" and job.polls >= job.finish_after_polls:
        job.state, job.reason = "SUCCEEDED", "all tasks exited 0"


@router.get("/{job_id}", response_model=schemas.JobOut)
def job_detail(job_id: str, state: State) -> Any:
    with state.lock:
        job = state.job(job_id)
        job.read(state)
        return job.detail()


@router.post("/{job_id}/cancel", response_model=schemas.JobOut)
def cancel(job_id: str, request: Request, state: State) -> Any:
    job, token = state.job(job_id), request.state.token
    user = token["user"]
    if state.cancel_refusal:
        raise HTTPException(403, state.cancel_refusal)
    if token["role"] != "admin" and job.submitted_by != user:
        owner = job.submitted_by
        raise HTTPException(403, f"{user!r} may cancel only their own jobs; {owner!r} submitted this one")
    with state.lock:
        if job.state in ENDED_STATES:
            raise HTTPException(409, f"job {job_id} already ended ({job.state})")
        job.state, job.reason = "CANCELLED", f"cancelled by {user}"
        job.cancelled_by, job.finished_at = user, now()
        for task in job.tasks or []:  # the coordinator's stops, answered at once here
            if task["state"] == "RUNNING":
                task.update(state="STOPPED", ended_at=_iso(now()))
        return job.detail()


@router.get("/{job_id}/logs", response_model=schemas.LogPage)
def logs(
    job_id: str,
    state: State,
    task: int | None = None,
    attempt: int | None = None,
    tail: Annotated[int, Query(ge=1, le=10000)] = 1000,
    after: int = 0,
    follow: bool = False,
) -> Any:
    def wanted(line: dict[str, Any], after: int) -> bool:
        chosen = (task is None or line["task"] == task) and (attempt is None or line["attempt"] == attempt)
        return chosen and line["id"] > after

    job = state.job(job_id)
    # Like the coordinator: without a cursor the newest `tail` lines, with one the next `tail` lines.
    lines = [line for line in job.logs if wanted(line, after)]
    lines = lines[:tail] if after else lines[-tail:]
    if not follow:
        return {"lines": lines, "next_after": lines[-1]["id"] if lines else after}

    def stream() -> Iterator[str]:
        # A scripted job ends after a few reads: drive it there, sending lines as they appear.
        sent = lines[0]["id"] - 1 if lines else after
        while True:
            for line in [line for line in job.logs if wanted(line, sent)]:
                yield json.dumps(line) + "\n"
                sent = line["id"]
            if job.state in ENDED_STATES:
                return
            with state.lock:
                job.read(state)

    return StreamingResponse(stream(), media_type="application/x-ndjson")


@router.get("/{job_id}/metrics", response_model=schemas.MetricSeries)
def metrics(
    job_id: str,
    state: State,
    name: str | None = None,
    min_step: int | None = None,
    max_step: int | None = None,
    attempt: int | None = None,
    after: int | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
) -> Any:
    # As the coordinator: a point's cursor is its place in storage (1-based), pages after it.
    matching = [
        (cursor, p)
        for cursor, p in enumerate(state.job(job_id).metrics, start=1)
        if (not name or p["name"] == name)
        and (min_step is None or p["step"] >= min_step)
        and (max_step is None or p["step"] <= max_step)
        and (attempt is None or p["attempt"] == attempt)
        and (after is None or cursor > after)
    ]
    if after is None:
        matching.sort(key=lambda pair: (pair[1]["name"], pair[1]["attempt"], pair[1]["step"]))
    page, more = matching[:limit], len(matching) > limit
    state.metric_reads.append({"after": after, "points": len(page)})
    if after is not None:
        cursor = page[-1][0] if page else after
    else:
        cursor = 0 if more else max((c for c, _ in page), default=0)
    return {"points": [p for _, p in page], "cursor": cursor, "more": more}


@router.get("/{job_id}/artifacts", response_model=list[schemas.ArtifactOut])
def artifacts(job_id: str, state: State) -> Any:
    state.job(job_id)
    stored = state.artifacts.get(job_id, {})
    return [
        {"path": path, "size": len(data), "sha256": sha256(data).hexdigest(), "attempt": 1, "created_at": T0}
        for path, data in stored.items()
    ]


@router.get(
    "/{job_id}/artifacts/{path:path}",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {"schema": BINARY}}}},
)
def artifact(job_id: str, path: str, state: State) -> Response:
    data = state.artifacts.get(job_id, {}).get(path)
    if data is None:
        raise HTTPException(404, f"no artifact {path}")
    return Response(data, media_type="application/octet-stream")


@router.get("/{job_id}/stacks", response_model=schemas.StackDumpsOut)
@router.post("/{job_id}/stacks", response_model=schemas.StackDumpsOut)
def stacks(job_id: str, state: State) -> Any:
    if job_id in state.stack_dumps:
        return state.stack_dumps[job_id]
    # Like the coordinator: 404 until a dump was taken (a job's latest_stacks names the newest).
    raise HTTPException(404, f"no stacks of job {state.job(job_id).id} were dumped yet")


@router.get("/{job_id}/devices", response_model=schemas.JobDevicesOut)
def job_devices(job_id: str, state: State) -> Any:
    # Its tasks' devices, without telemetry (the fake's agents sample none).
    job = state.job(job_id)
    keys = "agent_id agent_name device_kind device_indices device_uuids started_at ended_at".split()
    tasks = [
        {
            "task_index": task["index"],
            "device_uuids": [],
            "series": [],
            **{k: task[k] for k in keys if k in task},
        }
        for task in job.detail()["tasks"]
    ]
    return {"job_id": job.id, "attempt": job.attempts, "bucket_seconds": 10, "tasks": tasks}


@router.get("/{job_id}/preflight", response_model=schemas.PreflightOut)
def job_preflight(job_id: str, state: State) -> Any:
    return {"job_id": state.job(job_id).id, "attempts": []}

"""/api/v1/jobs/{id}/preflight: the preflight check's results of a job, per attempt and task."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from mwms.server.api.deps import ReadSession
from mwms.server.db.models import PreflightResult
from mwms.server.schemas import ErrorOut, PreflightAttemptOut, PreflightOut, PreflightResultOut
from mwms.server.services.observing import preflight

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])
ERRORS: dict[int | str, dict[str, Any]] = {401: {"model": ErrorOut}, 404: {"model": ErrorOut}}


@router.get("/{job_id}/preflight", response_model=PreflightOut, responses=ERRORS)
def job_preflight(job_id: str, session: ReadSession) -> PreflightOut:
    """Results of the gang's preflight check: reachability, all-reduce bandwidths, what failed."""
    by_attempt: dict[int, list[PreflightResult]] = {}
    for row in preflight.list_results(session, job_id):
        by_attempt.setdefault(row.attempt, []).append(row)
    return PreflightOut(
        job_id=job_id,
        attempts=[
            PreflightAttemptOut(
                attempt=number,
                ok=all(r.ok for r in rows),
                results=[
                    PreflightResultOut(
                        task_index=r.task_index,
                        task_id=r.task_id,
                        ok=r.ok,
                        message=r.message,
                        at=r.at,
                        report=r.report or {},
                    )
                    for r in rows
                ],
            )
            for number, rows in sorted(by_attempt.items())
        ],
    )

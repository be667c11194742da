"""Idempotent job submits: a client-generated key makes a resent `POST /api/v1/jobs` return the job the
first request created instead of starting a second one.

Keys are per submitter (the unique constraint is on submitted_by + idempotency_key): the same key from
another user names another job. A key reused for a different spec is refused, so a client bug cannot
silently hand back an unrelated job.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from mwms.server.db.models import Job
from mwms.server.errors import Conflict
from mwms.server.schemas import JobCreate
from mwms.server.services.job_life import jobs

IDEMPOTENCY_KEY_MAX_LENGTH = 100  # jobs.idempotency_key is String(100)
# What clients send in practice (UUIDs, ULIDs, "<pipeline-run>:<step>"); nothing that needs quoting.
IDEMPOTENCY_KEY_PATTERN = r"^[A-Za-z0-9._:\-]+$"


def find_or_create_job(
    session: Session,
    spec: JobCreate,
    submitted_by: str,
    idempotency_key: str | None,
    policy: jobs.SubmitPolicy | None = None,
) -> tuple[Job, bool]:
    """The job `submitted_by` already created with this key, else a new one: (job, created).

    Runs inside the caller's write transaction, which serialises submits, so two resends cannot both
    create. Conflict when the key was used for a different spec.
    """
    if idempotency_key is None:
        return jobs.create_job(session, spec, submitted_by=submitted_by, policy=policy), True
    existing = session.scalars(
        select(Job).where(Job.submitted_by == submitted_by, Job.idempotency_key == idempotency_key)
    ).one_or_none()
    if existing is not None:
        differing = spec_differences(existing, spec)
        if differing:
            raise Conflict(
                f"Idempotency-Key {idempotency_key!r} was already used for job {existing.id} with a different "
                f"spec ({', '.join(differing)} differ); send a new key for a new job, or the same spec to get "
                "that job back"
            )
        return existing, False
    job = jobs.create_job(session, spec, submitted_by=submitted_by, policy=policy)
    job.idempotency_key = idempotency_key
    session.flush()
    return job, True


def spec_differences(job: Job, spec: JobCreate) -> list[str]:
    """The spec fields whose values differ from what `job` was created with (those the job keeps)."""
    kept = jobs.spec_as_stored(job)
    if spec.name:  # without one the job was named after the command
        kept["name"] = job.name
    return [
        field
        for field, wanted in spec.model_dump(mode="json").items()
        if field in kept and kept[field] != wanted
    ]

"""Who may act on a job: the user who submitted it, or an admin. One check for every action that changes
a running job or its processes (cancel, stack dumps), so a new one cannot forget it.
"""

from __future__ import annotations

from mwms.server.db.models import Job
from mwms.server.errors import Forbidden


def check_job_owner(job: Job, user: str, any_owner: bool, action: str) -> None:
    """Forbidden unless `user` submitted `job` or `any_owner` (the caller is an admin); `action` completes
    "only that user or an admin may ...", e.g. "cancel it"."""
    if any_owner or job.submitted_by == user:
        return
    raise Forbidden(
        f"job {job.id} was submitted by {job.submitted_by or 'another user'!r}; only that user or an admin "
        f"may {action}"
    )

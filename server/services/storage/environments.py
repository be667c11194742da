"""Where each task's own Python environment stands on its agent, and whether a gang's agree.

An agent reports "building", then "ready" with how long the build took (0 from its cache), what the
environment holds (a digest of its installed packages) and the Python and platform it is for. The
start-up timeout does not count a build (services/job_life/reconcile.py). A lock resolved with `--universal` may
pin other versions for other Pythons or platforms: workers whose agents built different packages would run
different code in one collective, so such an attempt ends at once, saying which workers differ and how.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from mwms.server.db.models import Agent, Attempt, Job, Task
from mwms.server.services.job_life import attempt_endings
from mwms.server.services.job_life.lifecycle import fail_attempt
from mwms.server.states import TaskState

if TYPE_CHECKING:
    from mwms.server.services.job_life.tasks import TaskReport

NOT_RETRIED = (
    " (not retried: the same agents would build the same; submit with --python to build every worker's "
    "environment for one Python, or pin the job to agents alike with --agents)"
)


def note_environment(session: Session, task: Task, report: TaskReport, now: datetime) -> Task | None:
    """Records where the task's environment stands (idempotent: a resent report changes nothing); the
    sibling whose ready environment holds something else, when this one is ready and there is one."""
    if report.environment == task.environment:
        return None
    task.environment = report.environment
    if report.message and not TaskState(task.state).terminal:
        task.message = report.message
    if report.environment != "ready":
        return None
    task.environment_ready_at = now
    task.environment_build_s = report.environment_build_s
    task.environment_digest = report.environment_digest
    task.environment_platform = report.environment_platform
    return disagreeing_sibling(session, task)


def disagreeing_sibling(session: Session, task: Task) -> Task | None:
    """A task of the same attempt whose ready environment holds other packages than `task`'s."""
    attempt = session.get(Attempt, task.attempt_id)
    for other in attempt.tasks if attempt is not None else []:
        if (
            other.id != task.id
            and other.environment == "ready"
            and other.environment_digest
            and task.environment_digest
            and other.environment_digest != task.environment_digest
        ):
            return other
    return None


def fail_disagreeing_attempt(
    session: Session, task: Task, other: Task, backoff_base_s: float, now: datetime
) -> None:
    """Ends the attempt of `task`, whose environment differs from `other`'s, naming both (not retried)."""
    job, attempt = session.get(Job, task.job_id), session.get(Attempt, task.attempt_id)
    if job is None or attempt is None:
        return
    first, second = sorted((task, other), key=lambda t: t.index)

    def where(worker: Task) -> str:
        agent = session.get(Agent, worker.agent_id)
        name = agent.name if agent is not None else worker.agent_id
        return f"worker {worker.index} on {name} ({worker.environment_platform or 'unknown Python'})"

    reason = (
        f"the workers would run different packages: {where(first)} and {where(second)} installed different "
        "versions from the job's lock, which pins some packages apart for other Pythons or platforms"
    )
    fail_attempt(
        session,
        job,
        attempt,
        reason,
        retryable=False,
        backoff_base_s=backoff_base_s,
        now=now,
        not_retried=NOT_RETRIED,
        ending=attempt_endings.environment_mismatch([first.index, second.index]),
    )

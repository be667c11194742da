"""Preempting a placed job: a higher priority, a team reclaiming its quota, a drain.

Its whole gang is asked to stop, with a grace to save a checkpoint; the attempt ends PREEMPTED and the job
is PREEMPTING until every worker has exited (release_preempted), then waits again in its place, no restart
used. The time it waits does not count against max_runtime_seconds (preempted_seconds).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from mwms.server.db.models import Job, Preemption, utcnow
from mwms.server.observability.event_log import log_after_commit, reason_summary
from mwms.server.observability.instruments import count_preemption
from mwms.server.services.job_life import attempt_endings
from mwms.server.services.job_life.attempt_endings import AttemptEnding
from mwms.server.services.job_life.task_stops import agent_is_gone, current_attempt, request_stop
from mwms.server.services.job_life.transitions import transition_attempt, transition_job, transition_task
from mwms.server.states import AttemptState, JobState, TaskState
from mwms.task_environment import PREEMPTED_AND_SAVED_EXIT_CODE

# Why a job was preempted: for a higher-priority job, for a team reclaiming its quota from a borrower,
# or because an admin drains an agent it runs on.
PREEMPTION_CAUSES = ("priority", "reclaim", "drain")


def preempt_job(
    session: Session,
    job: Job,
    cause: str,
    why: str,
    grace_s: int,
    preemptor: Job | None = None,
    now: datetime | None = None,
    ending: AttemptEnding | None = None,
) -> bool:
    """Preempts a placed job's whole gang: every task is asked to stop now with `grace_s` of grace.

    The attempt ends PREEMPTED and the job is PREEMPTING until every task has exited
    (release_preempted); it then waits again in its original place, no restart used. Returns False
    (nothing done) for a job that has no ACTIVE attempt or is not SCHEDULED/RUNNING. The attempt's
    ending is `ending`, else made from `cause` and `preemptor` (its id and priority, its team's reclaim).
    """
    now = now or utcnow()
    attempt = current_attempt(job)
    if job.state not in (JobState.SCHEDULED.value, JobState.RUNNING.value):
        return False
    if attempt is None or attempt.state != AttemptState.ACTIVE.value:
        return False
    for task in attempt.tasks:
        if not TaskState(task.state).terminal and not task.stop_requested:
            task.stop_grace_s = grace_s
        request_stop(task, f"preempted: {why}")
        if task.state == TaskState.ASSIGNED.value and agent_is_gone(session, task):
            transition_task(session, task, TaskState.STOPPED, f"preempted: {why}", now)
    ending = ending or attempt_endings.for_preemption(cause, preemptor)
    transition_attempt(session, attempt, AttemptState.PREEMPTED, f"preempted: {why}", now, ending)
    session.add(
        Preemption(
            victim_job_id=job.id,
            attempt_id=attempt.id,
            preemptor_job_id=preemptor.id if preemptor is not None else None,
            cause=cause,
            at=now,
        )
    )
    count_preemption(session, cause)
    log_after_commit(
        session,
        f"job {job.id} attempt {attempt.number} preempted ({cause}"
        + (f", for job {preemptor.id}" if preemptor is not None else "")
        + f"): {reason_summary(why)}; its workers have {grace_s} s to save",
        event="job_preempted",
        job_id=job.id,
        attempt=attempt.number,
        cause=cause,
        preemptor_job_id=preemptor.id if preemptor is not None else None,
        grace_s=grace_s,
        reason=reason_summary(why),
    )
    transition_job(
        session,
        job,
        JobState.PREEMPTING,
        f"preempted ({why}): its workers got SIGTERM and have {grace_s} s to save before SIGKILL; it then "
        "waits in its place again, no restart used",
        now,
    )
    return True


def release_preempted(session: Session, job: Job, now: datetime) -> None:
    """A PREEMPTING job whose tasks have all exited waits again (PENDING), keeping its place in the order."""
    attempt = current_attempt(job)
    if attempt is None or any(not TaskState(t.state).terminal for t in attempt.tasks):
        return
    record = session.scalars(select(Preemption).where(Preemption.attempt_id == attempt.id)).one_or_none()
    saved = all(t.exit_code == PREEMPTED_AND_SAVED_EXIT_CODE for t in attempt.tasks)
    if record is not None and record.ended_at is None:
        record.ended_at, record.saved = now, saved
    ending = (
        "every worker saved a checkpoint and exited"
        if saved
        else "its workers have exited (not every one reported a saved checkpoint: it resumes from its last one)"
    )
    transition_job(
        session,
        job,
        JobState.PENDING,
        f"preempted in attempt {attempt.number}: {ending}; placing attempt {attempt.number + 1}",
        now,
    )


def preempted_seconds(job: Job, now: datetime) -> float:
    """Seconds the job has spent preempted (waiting to run again), which max_runtime_seconds does not count.

    The scheduler adds each finished wait to options["preempted_s"] when it places the job again; a job
    that waits now also counts the time since its preempted attempt ended.
    """
    stored = job.options.get("preempted_s")
    total = float(stored) if isinstance(stored, (int, float)) and 0 <= stored < 1e12 else 0.0
    attempt = current_attempt(job)
    waiting = job.state in (JobState.PREEMPTING.value, JobState.PENDING.value)
    if waiting and attempt is not None and attempt.state == AttemptState.PREEMPTED.value and attempt.ended_at:
        total += max(0.0, (now - attempt.ended_at).total_seconds())
    return total

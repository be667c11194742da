"""Ending an attempt that failed or that an agent refused to start.

A failed attempt restarts its whole gang with backoff, or fails the job (fail_attempt); settle_failed_attempt
picks the task that caused the failure and when to decide: a command that cannot be executed fails the job
at once, a retryable cause anywhere in the gang makes the attempt retryable. A refused attempt is placed
again, or fails the job after too many refusals in a row (replace_attempt).
server/services/job_life/lifecycle.py calls in here when a task's change ends its attempt.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from mwms.server.db.models import Agent, Attempt, Job, Task, utcnow
from mwms.server.observability.event_log import log_after_commit, reason_summary
from mwms.server.observability.instruments import count_restart
from mwms.server.services.job_life import attempt_endings
from mwms.server.services.job_life.attempt_endings import AttemptEnding
from mwms.server.services.job_life.failure_reasons import (
    describe_task_failure,
    failure_ending,
    peer_stop_reason,
    restart_cause,
)
from mwms.server.services.job_life.restart_policy import (
    ENVIRONMENT_NOT_RETRIED,
    NEVER_STARTED_NOT_RETRIED,
    is_retryable,
    never_started,
    restart_backoff,
    restart_policy_value,
)
from mwms.server.services.job_life.task_stops import request_stop, stop_grace_for
from mwms.server.services.job_life.transitions import transition_attempt, transition_job
from mwms.server.states import AttemptState, JobState, TaskState
from mwms.task_environment import ENVIRONMENT_NOT_BUILT_EXIT_CODE

# A port can be busy by chance, a bundle fetch can fail; a command that cannot be executed is not a refusal
# (the agent reports it FAILED, never started: see restart_policy.never_started) and ends the job at the first
# report.
MAX_REFUSALS_IN_A_ROW = 5


def fail_attempt(
    session: Session,
    job: Job,
    attempt: Attempt,
    reason: str,
    *,
    retryable: bool,
    backoff_base_s: float,
    now: datetime | None = None,
    log_tail: list[str] | None = None,
    cause: str = "other",
    not_retried: str = "",
    ending: AttemptEnding | None = None,
) -> None:
    """Ends an attempt after a failure: stops any task still running, then restarts or fails the job.

    An attempt that is no longer ACTIVE is left as it is. The reason people read is `reason`, then what
    happens next, then the failing task's last log lines. `cause` labels a restart in
    mwms_job_restarts_total (mwms.server.observability.instruments.RESTART_CAUSES). `not_retried`
    replaces the usual explanation of a failure that is not retryable. The attempt ends with `ending`
    (what failed), which notes the restart when the job restarts.
    """
    now = now or utcnow()
    if attempt.state != AttemptState.ACTIVE.value:
        return
    for task in attempt.tasks:
        request_stop(task, peer_stop_reason(ending), stop_grace_for(job))
    tail = ("\nlast log lines:\n" + "\n".join(log_tail)) if log_tail else ""
    ended = JobState(job.state).terminal  # a job already ended keeps its ending: no restart
    max_restarts = 0 if ended else int(restart_policy_value(job, "max_restarts"))
    restarts = not ended and retryable and job.restarts < max_restarts
    ending = ending or AttemptEnding(attempt_endings.UNRECORDED)
    if restarts:
        ending = ending.with_restart(job.restarts + 1, max_restarts, cause)
    transition_attempt(session, attempt, AttemptState.FAILED, reason + tail, now, ending)
    if ended:
        return
    if restarts:
        delay = restart_backoff(backoff_base_s, job.restarts)
        job.restarts += 1
        job.not_before = now + timedelta(seconds=delay)
        count_restart(session, cause)
        log_after_commit(
            session,
            f"job {job.id} restarts its whole gang after attempt {attempt.number} ({cause}): restart "
            f"{job.restarts} of {max_restarts} in {delay:.0f} s: {reason_summary(reason)}",
            event="job_restart",
            job_id=job.id,
            attempt=attempt.number,
            cause=cause,
            restart=job.restarts,
            max_restarts=max_restarts,
            delay_s=delay,
            reason=reason_summary(reason),
        )
        transition_job(
            session,
            job,
            JobState.RESTARTING,
            f"{reason}; restart {job.restarts} of {max_restarts} in {delay:.0f} s{tail}",
            now,
        )
        return
    suffix = (
        ""
        if retryable
        else not_retried or " (not retryable: exit codes 1-127 are permanent unless restart_on is 'any')"
    )
    if retryable and max_restarts:
        suffix = f" (all {max_restarts} restarts used)"
    transition_job(session, job, JobState.FAILED, reason + suffix + tail, now)


def replace_attempt(
    session: Session,
    job: Job,
    attempt: Attempt,
    reason: str,
    now: datetime | None,
    ending: AttemptEnding | None = None,
) -> None:
    """An agent could not start its ACTIVE attempt's task: drop the attempt and place the job again,
    not as a restart."""
    for task in attempt.tasks:
        request_stop(task, "attempt is being placed again", stop_grace_for(job))
    ending = ending or AttemptEnding(attempt_endings.UNRECORDED)
    transition_attempt(session, attempt, AttemptState.REPLACED, reason, now, ending)
    # Tasks are refused only before they run, so the job is still SCHEDULED (unless it was cancelled).
    if job.state != JobState.SCHEDULED.value:
        return
    refusals = 0
    for earlier in reversed(job.attempts):
        if earlier.state != AttemptState.REPLACED.value:
            break
        refusals += 1
    if refusals >= MAX_REFUSALS_IN_A_ROW:
        transition_job(
            session,
            job,
            JobState.FAILED,
            f"{reason}; agents refused to start this job {refusals} times in a row: fix the cause and submit again",
            now,
        )
        return
    transition_job(session, job, JobState.PENDING, f"{reason}; placing the job again", now)


# The states of a task that may have caused its attempt's failure (is_cause looks closer).
CAUSE_STATES = (TaskState.FAILED, TaskState.STOPPED, TaskState.LOST)


def is_cause(task: Task) -> bool:
    """Ended on its own (not because it was asked to stop), or lost with its agent."""
    state = TaskState(task.state)
    if state == TaskState.LOST:
        return True
    return state in CAUSE_STATES and not task.stop_requested


def settle_failed_attempt(
    session: Session, job: Job, attempt: Attempt, backoff_base_s: float, now: datetime
) -> None:
    """Decides between restart and failure for an attempt that has a failed task.

    A retryable cause (a signal, a lost agent) decides at once. A permanent one (exit code 1-127) waits
    until every task has ended, because the first failure seen is often a consequence: when one worker is
    killed or its machine is lost, the survivors' collectives fail with exit code 1 within seconds, before
    the lost agent is detected. A retryable cause anywhere in the gang makes the attempt retryable, and
    it is named in the reason.
    """
    causes = [t for t in attempt.tasks if is_cause(t)]
    if not causes:
        return
    unstartable = [t for t in causes if never_started(t)]
    if unstartable:  # certain at once, and no restart_on makes it retryable
        root = min(unstartable, key=lambda t: (t.ended_at or now, t.index))
        agent = session.get(Agent, root.agent_id)
        reason, tail = describe_task_failure(session, root, agent.name if agent else root.agent_id)
        fail_attempt(
            session,
            job,
            attempt,
            reason,
            retryable=False,
            backoff_base_s=backoff_base_s,
            now=now,
            log_tail=tail,
            not_retried=ENVIRONMENT_NOT_RETRIED
            if root.exit_code == ENVIRONMENT_NOT_BUILT_EXIT_CODE
            else NEVER_STARTED_NOT_RETRIED,
            ending=attempt_endings.task_failed(root, agent.name if agent else root.agent_id),
        )
        return
    restart_on = restart_policy_value(job, "restart_on")
    retryable = [t for t in causes if is_retryable(t.exit_code, t.state == TaskState.LOST.value, restart_on)]
    if not retryable and not all(TaskState(t.state).terminal for t in attempt.tasks):
        return  # only permanent causes so far: a retryable one may still explain them
    root = min(retryable or causes, key=lambda t: (t.ended_at or now, t.index))
    agent = session.get(Agent, root.agent_id)
    reason, tail = describe_task_failure(session, root, agent.name if agent else root.agent_id)
    fail_attempt(
        session,
        job,
        attempt,
        reason,
        retryable=bool(retryable),
        backoff_base_s=backoff_base_s,
        now=now,
        log_tail=tail,
        cause=restart_cause(root),
        ending=failure_ending(root, agent),
    )

"""The lifecycle rules: what a job and its attempt become next when something happens to them.

Every decision that picks a job's or an attempt's next state lives here or in a module next to it: a new
attempt is placed, its workers are all running, it succeeds, a task fails (restart with backoff or fail, and which task
is the cause; a command the agent could not execute fails the job at once), an agent refuses a task
(place again, or fail after too many refusals in a row), a task is lost, the job is ended (cancel,
runtime limit, NaN metric), a restart's backoff is over, the job is preempted (a higher priority, a team
reclaiming its quota, a drain) and its workers have all exited. Every stop of a job's tasks carries the
job's own grace (preemption_grace_seconds) when it set one, else the coordinator's short MWMS_STOP_GRACE_S.
The services that notice these things (tasks, jobs, scheduling, reconcile, hangs, agents) call in here;
server/services/job_life/transitions.py applies the chosen change, checked against server/states.py. Every ending
of an attempt carries its cause and what acted on it (server/services/job_life/attempt_endings.py): the caller that
knows the actor (a drain's agent and admin, a cancel's user) passes it, the rest are built here.

Restart policy defaults come from schemas.RestartPolicy alone (restart_policy_value).

This module keeps the entry points (placing an attempt, a restart's release, ending a job, what a task's
change means: after_task_change); the rest is split by concern next to it, and every name is importable from
here too: restart_policy.py (restart options, retryable exit codes, backoff), task_stops.py (asking tasks to
stop, with the job's grace), failure_reasons.py (what a failure reads, how it is counted), preemption.py
(preempting a job, its return to the queue), attempt_failures.py (an attempt that failed or was refused:
restart, place again or fail).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from mwms.server.db.models import Agent, Attempt, Job, Task
from mwms.server.services.job_life import attempt_endings
from mwms.server.services.job_life.attempt_endings import AttemptEnding
from mwms.server.services.job_life.attempt_failures import CAUSE_STATES, is_cause, settle_failed_attempt
from mwms.server.services.job_life.attempt_failures import MAX_REFUSALS_IN_A_ROW as MAX_REFUSALS_IN_A_ROW
from mwms.server.services.job_life.attempt_failures import fail_attempt as fail_attempt
from mwms.server.services.job_life.attempt_failures import replace_attempt as replace_attempt
from mwms.server.services.job_life.failure_reasons import FAILURE_LOG_LINES as FAILURE_LOG_LINES
from mwms.server.services.job_life.failure_reasons import describe_task_failure as describe_task_failure
from mwms.server.services.job_life.failure_reasons import last_log_lines as last_log_lines
from mwms.server.services.job_life.failure_reasons import peer_stop_reason as peer_stop_reason
from mwms.server.services.job_life.failure_reasons import worker_failed_reason as worker_failed_reason
from mwms.server.services.job_life.preemption import PREEMPTION_CAUSES as PREEMPTION_CAUSES
from mwms.server.services.job_life.preemption import preempt_job as preempt_job
from mwms.server.services.job_life.preemption import preempted_seconds as preempted_seconds
from mwms.server.services.job_life.preemption import release_preempted as release_preempted
from mwms.server.services.job_life.restart_policy import ENVIRONMENT_NOT_RETRIED as ENVIRONMENT_NOT_RETRIED
from mwms.server.services.job_life.restart_policy import NEVER_STARTED_EXIT_CODES as NEVER_STARTED_EXIT_CODES
from mwms.server.services.job_life.restart_policy import (
    NEVER_STARTED_NOT_RETRIED as NEVER_STARTED_NOT_RETRIED,
)
from mwms.server.services.job_life.restart_policy import fail_on_nan_names as fail_on_nan_names
from mwms.server.services.job_life.restart_policy import is_retryable as is_retryable
from mwms.server.services.job_life.restart_policy import never_started as never_started
from mwms.server.services.job_life.restart_policy import restart_backoff as restart_backoff
from mwms.server.services.job_life.restart_policy import restart_policy_value as restart_policy_value
from mwms.server.services.job_life.task_stops import agent_is_gone
from mwms.server.services.job_life.task_stops import current_attempt as current_attempt
from mwms.server.services.job_life.task_stops import request_stop as request_stop
from mwms.server.services.job_life.task_stops import stop_grace_for as stop_grace_for
from mwms.server.services.job_life.transitions import transition_attempt, transition_job, transition_task
from mwms.server.services.wording import count
from mwms.server.states import TERMINAL_TASK_STATES, AttemptState, JobState, TaskState

_TERMINAL_TASK_STATES = [state.value for state in TERMINAL_TASK_STATES]

# -- placement and restarts ---------------------------------------------------------------------------


def open_attempt(session: Session, job: Job, now: datetime | None = None) -> Attempt:
    """A new ACTIVE attempt for a job about to be placed; the caller adds its tasks."""
    attempt = Attempt(job_id=job.id, number=len(job.attempts) + 1, state="")
    job.attempts.append(attempt)
    session.flush()
    transition_attempt(session, attempt, AttemptState.ACTIVE, f"placing attempt {attempt.number}", now)
    return attempt


def attempt_placed(
    session: Session,
    job: Job,
    attempt: Attempt,
    endpoints: list[str],
    agents: list[str],
    now: datetime,
    note: str = "",
) -> None:
    """Every task of the attempt has a place: the job is SCHEDULED; `note` ends the reason (its event's
    too), such as placement.shared_agent_note's."""
    transition_job(
        session,
        job,
        JobState.SCHEDULED,
        f"attempt {attempt.number}: {count(len(endpoints), 'worker')} on {count(len(agents), 'agent')}: "
        + ", ".join(endpoints)
        + note,
        now,
    )


def release_restart(session: Session, job: Job, now: datetime) -> None:
    """A RESTARTING job whose backoff is over and whose old tasks have all ended becomes PENDING."""
    if job.not_before is not None and job.not_before > now:
        return
    # Asked of the database: a job restarted a thousand times has a thousand attempts' tasks to load.
    unended = select(Task.state).where(Task.job_id == job.id, Task.state.not_in(_TERMINAL_TASK_STATES))
    # A state this version does not know raises: the job is skipped, counted as poison (server/poison.py).
    if [TaskState(state) for state in session.scalars(unended.distinct())]:
        return
    newest = session.scalar(select(func.max(Attempt.number)).where(Attempt.job_id == job.id)) or 0
    transition_job(session, job, JobState.PENDING, f"placing attempt {newest + 1}", now)


# -- ending a job -------------------------------------------------------------------------------------


def end_job(
    session: Session,
    job: Job,
    final: JobState,
    reason: str,
    now: datetime | None = None,
    ending: AttemptEnding | None = None,
) -> None:
    """Ends a job now (cancel, runtime limit): stops every task of its current attempt.

    An attempt still ACTIVE ends with `ending`; without one, a cancel names job.cancelled_by."""
    attempt = current_attempt(job)
    if attempt is not None:
        for task in attempt.tasks:
            request_stop(task, reason, stop_grace_for(job))
            if task.state == TaskState.ASSIGNED.value and agent_is_gone(session, task):
                transition_task(session, task, TaskState.STOPPED, reason, now)
        if attempt.state == AttemptState.ACTIVE.value:  # an attempt that already ended keeps its ending
            outcome = AttemptState.CANCELLED if final == JobState.CANCELLED else AttemptState.FAILED
            if ending is None:
                ending = (
                    attempt_endings.cancelled(job.cancelled_by)
                    if final == JobState.CANCELLED
                    else AttemptEnding(attempt_endings.UNRECORDED)
                )
            transition_attempt(session, attempt, outcome, reason, now, ending)
    transition_job(session, job, final, reason, now)


def fail_on_nan_metric(
    session: Session, job: Job, task: Task, name: str, step: int, now: datetime | None = None
) -> bool:
    """restart.fail_on_nan: a NaN value of a named metric from the current attempt fails the job, no restart.

    Returns True when the job was failed (its tasks are asked to stop).
    """
    if name not in fail_on_nan_names(job) or JobState(job.state).terminal:
        return False
    attempt = current_attempt(job)
    if attempt is None or attempt.id != task.attempt_id or attempt.state != AttemptState.ACTIVE.value:
        return False
    end_job(
        session,
        job,
        JobState.FAILED,
        f"metric {name!r} was NaN at step {step} in attempt {attempt.number}; restart.fail_on_nan "
        "fails the job without a restart",
        now,
        attempt_endings.nan_metric(name, step),
    )
    return True


# -- reacting to a task's change ----------------------------------------------------------------------


def _every_task_is(session: Session, attempt: Attempt, state: TaskState) -> bool:
    """Whether every task of `attempt` is in `state`, asked of the database (the session's changes flushed
    first) rather than by loading the attempt's tasks: each report of a 256-worker gang loaded all 256, so
    starting or ending a gang cost time quadratic in its size (bench/README.md, gangs)."""
    other = select(Task.id).where(Task.attempt_id == attempt.id, Task.state != state.value).limit(1)
    return session.scalar(other) is None


def _some_task_is(session: Session, attempt: Attempt, states: tuple[TaskState, ...]) -> bool:
    """Whether a task of `attempt` is in one of `states` (one query, as _every_task_is)."""
    found = select(Task.id).where(Task.attempt_id == attempt.id, Task.state.in_([s.value for s in states]))
    return session.scalar(found.limit(1)) is not None


def after_task_change(
    session: Session, agent: Agent, task: Task, backoff_base_s: float, now: datetime
) -> None:
    """What the task's new state means for its attempt and job (nothing once the attempt has ended)."""
    attempt = session.get(Attempt, task.attempt_id)
    job = session.get(Job, task.job_id)
    assert attempt is not None and job is not None
    state = TaskState(task.state)
    if attempt.state != AttemptState.ACTIVE.value:
        return
    if state == TaskState.RUNNING:
        if job.state == JobState.SCHEDULED.value and _every_task_is(session, attempt, TaskState.RUNNING):
            transition_job(
                session,
                job,
                JobState.RUNNING,
                "every worker is running" if len(attempt.tasks) > 1 else "the worker is running",
                now,
            )
    elif state == TaskState.SUCCEEDED:
        if _every_task_is(session, attempt, TaskState.SUCCEEDED):
            transition_attempt(
                session,
                attempt,
                AttemptState.SUCCEEDED,
                "every task exited 0",
                now,
                attempt_endings.succeeded(),
            )
            if job.state == JobState.SCHEDULED.value:
                transition_job(session, job, JobState.RUNNING, "all workers started", now)
            transition_job(
                session,
                job,
                JobState.SUCCEEDED,
                "every task exited 0" if len(attempt.tasks) > 1 else "the task exited 0",
                now,
            )
        elif _some_task_is(session, attempt, CAUSE_STATES):
            # The last task of a failing attempt may end with 0 before its stop arrives. Without a task that
            # failed, stopped or was lost there is nothing to settle (and no reason to load every task).
            settle_failed_attempt(session, job, attempt, backoff_base_s, now)
    elif state == TaskState.REJECTED:
        replace_attempt(
            session,
            job,
            attempt,
            f"agent {agent.name} could not start task {task.index}: {task.message}",
            now,
            attempt_endings.refused(task, agent),
        )
    elif state in (TaskState.FAILED, TaskState.STOPPED, TaskState.LOST):
        if is_cause(task):
            for other in attempt.tasks:
                request_stop(other, worker_failed_reason(task), stop_grace_for(job))
        settle_failed_attempt(session, job, attempt, backoff_base_s, now)


def mark_task_lost(
    session: Session, agent: Agent, task: Task, why: str, backoff_base_s: float, now: datetime
) -> None:
    """Ends a task whose agent is gone or no longer knows it, and lets its attempt react."""
    if TaskState(task.state).terminal:
        return
    transition_task(session, task, TaskState.LOST, why, now)
    after_task_change(session, agent, task, backoff_base_s, now)

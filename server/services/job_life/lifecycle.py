"""The lifecycle rules: what a job and its attempt become next when something happens to them.

Every decision that picks a job's or an attempt's next state lives here: a new attempt is placed,
its workers are all running, it succeeds, a task fails (restart with backoff or fail, and which task
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
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from mwms.server.db.models import Agent, Attempt, Job, LogLine, Preemption, Task, utcnow
from mwms.server.observability.event_log import log_after_commit, reason_summary
from mwms.server.observability.instruments import count_preemption, count_restart
from mwms.server.schemas import RestartOn, RestartPolicy
from mwms.server.services.job_life import attempt_endings
from mwms.server.services.job_life.attempt_endings import AttemptEnding
from mwms.server.services.job_life.transitions import transition_attempt, transition_job, transition_task
from mwms.server.services.wording import count
from mwms.server.states import AttemptState, JobState, TaskState
from mwms.task_environment import (
    COMMAND_NOT_EXECUTABLE_EXIT_CODE,
    COMMAND_NOT_FOUND_EXIT_CODE,
    ENVIRONMENT_NOT_BUILT_EXIT_CODE,
    PREEMPTED_AND_SAVED_EXIT_CODE,
)

FAILURE_LOG_LINES = 10
# A port can be busy by chance, a bundle fetch can fail; a command that cannot be executed is not a refusal
# (the agent reports it FAILED, never started: see never_started) and ends the job at the first report.
MAX_REFUSALS_IN_A_ROW = 5
_DEFAULT_POLICY = RestartPolicy()


# -- restart policy -----------------------------------------------------------------------------------


def restart_policy_value(job: Job, name: str) -> Any:
    """The job's stored restart option `name`, or RestartPolicy's default for it.

    Read field by field, not validated, so a damaged row behaves as it always did.
    """
    default = getattr(_DEFAULT_POLICY, name)
    return job.options.get("restart", {}).get(
        name, default.value if isinstance(default, RestartOn) else default
    )


def fail_on_nan_names(job: Job) -> list[str]:
    """Metric names whose NaN value fails the job at once (restart.fail_on_nan)."""
    names = restart_policy_value(job, "fail_on_nan") or []
    if isinstance(names, str):
        return [names]
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def is_retryable(exit_code: int | None, lost: bool, restart_on: str) -> bool:
    """Lost agents and exit codes >= 128 (signals, OOM kills) are retryable; 1-127 only with restart_on=any."""
    if lost or exit_code is None:
        return True
    if restart_on == RestartOn.ANY.value:
        return exit_code != 0
    return exit_code >= 128 or exit_code < 0


NEVER_STARTED_EXIT_CODES = frozenset(
    {COMMAND_NOT_FOUND_EXIT_CODE, COMMAND_NOT_EXECUTABLE_EXIT_CODE, ENVIRONMENT_NOT_BUILT_EXIT_CODE}
)
NEVER_STARTED_NOT_RETRIED = (
    " (not retried: the command cannot be executed, so no restart or other agent can help; fix the "
    "command and submit again)"
)
ENVIRONMENT_NOT_RETRIED = (
    " (not retried: the job's Python environment cannot be built, so no restart or other agent can help; "
    "fix its requirements and submit again)"
)


def never_started(task: Task) -> bool:
    """The agent could not execute the task's command or build its environment (FAILED, no process, exit
    code 125, 126 or 127)."""
    return (
        task.state == TaskState.FAILED.value
        and task.pid is None
        and task.exit_code in NEVER_STARTED_EXIT_CODES
    )


def restart_backoff(base_s: float, restarts_done: int) -> float:
    """Seconds to wait before restart number `restarts_done + 1`: doubling, capped at 60 s."""
    return min(60.0, base_s * (2**restarts_done))


# -- small reads --------------------------------------------------------------------------------------


def current_attempt(job: Job) -> Attempt | None:
    """The job's latest attempt, None before its first placement."""
    return job.attempts[-1] if job.attempts else None


def stop_grace_for(job: Job) -> int | None:
    """The SIGTERM-to-SIGKILL grace the job asked for (preemption_grace_seconds), which every stop of its
    tasks gets; None: the coordinator's MWMS_STOP_GRACE_S (1 s by default, so a cancel or a restart is
    prompt even for a program that catches SIGTERM, as TensorFlow does)."""
    grace = job.options.get("preemption_grace_seconds") if isinstance(job.options, dict) else None
    return grace if isinstance(grace, int) and not isinstance(grace, bool) and grace >= 0 else None


def request_stop(task: Task, reason: str, grace_s: int | None = None) -> None:
    """Asks the task's agent to stop it (with `grace_s` before SIGKILL when given); the agent's report
    ends the task."""
    if not TaskState(task.state).terminal and not task.stop_requested:
        task.stop_requested = True
        task.stop_reason = reason
        if grace_s is not None and task.stop_grace_s is None:
            task.stop_grace_s = grace_s


def worker_failed_reason(failed: Task) -> str:
    """What a peer of `failed` reads when it is stopped because `failed` ended on its own."""
    what = "was lost" if failed.state == TaskState.LOST.value else "failed"
    return f"stopped because worker {failed.index} {what}"


def peer_stop_reason(ending: AttemptEnding | None) -> str:
    """What the tasks still running read when their attempt fails: the worker that failed, when one did."""
    failed = ending.details.get("task") if ending is not None else None
    if not isinstance(failed, int) or ending is None:
        return "stopped because its attempt failed"
    what = "was lost" if ending.kind == "agent_lost" else "failed"
    return f"stopped because worker {failed} {what}"


def last_log_lines(session: Session, task: Task, count: int = FAILURE_LOG_LINES) -> list[str]:
    """The task's last `count` log lines, oldest first (each line's newest state: no redrawn ones)."""
    rows = session.scalars(
        select(LogLine.text)
        .where(LogLine.task_id == task.id, LogLine.superseded.is_(False))
        .order_by(LogLine.seq.desc())
        .limit(count)
    ).all()
    return list(reversed(rows))


def describe_task_failure(session: Session, task: Task, agent_name: str) -> tuple[str, list[str]]:
    """('task 1 on agent X: exited with code 3', its last log lines)."""
    head = f"task {task.index} on agent {agent_name}: " + (
        task.message or f"exited with code {task.exit_code}"
    )
    return head, last_log_lines(session, task)


def _agent_is_gone(session: Session, task: Task) -> bool:
    agent = session.get(Agent, task.agent_id)
    return agent is None or agent.lost_at is not None


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
    if any(not TaskState(t.state).terminal for a in job.attempts for t in a.tasks):
        return
    transition_job(session, job, JobState.PENDING, f"placing attempt {len(job.attempts) + 1}", now)


# -- preemption ---------------------------------------------------------------------------------------

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
        if task.state == TaskState.ASSIGNED.value and _agent_is_gone(session, task):
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
            if task.state == TaskState.ASSIGNED.value and _agent_is_gone(session, task):
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


# -- ending an attempt --------------------------------------------------------------------------------


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


# -- reacting to a task's change ----------------------------------------------------------------------


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
        if job.state == JobState.SCHEDULED.value and all(
            t.state == TaskState.RUNNING.value for t in attempt.tasks
        ):
            transition_job(
                session,
                job,
                JobState.RUNNING,
                "every worker is running" if len(attempt.tasks) > 1 else "the worker is running",
                now,
            )
    elif state == TaskState.SUCCEEDED:
        if all(t.state == TaskState.SUCCEEDED.value for t in attempt.tasks):
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
        else:  # the last task of a failing attempt may end with 0 before its stop arrives
            _settle_failed_attempt(session, job, attempt, backoff_base_s, now)
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
        if _is_cause(task):
            for other in attempt.tasks:
                request_stop(other, worker_failed_reason(task), stop_grace_for(job))
        _settle_failed_attempt(session, job, attempt, backoff_base_s, now)


def mark_task_lost(
    session: Session, agent: Agent, task: Task, why: str, backoff_base_s: float, now: datetime
) -> None:
    """Ends a task whose agent is gone or no longer knows it, and lets its attempt react."""
    if TaskState(task.state).terminal:
        return
    transition_task(session, task, TaskState.LOST, why, now)
    after_task_change(session, agent, task, backoff_base_s, now)


def _is_cause(task: Task) -> bool:
    """Ended on its own (not because it was asked to stop), or lost with its agent."""
    state = TaskState(task.state)
    if state == TaskState.LOST:
        return True
    return state in (TaskState.FAILED, TaskState.STOPPED) and not task.stop_requested


def _settle_failed_attempt(
    session: Session, job: Job, attempt: Attempt, backoff_base_s: float, now: datetime
) -> None:
    """Decides between restart and failure for an attempt that has a failed task.

    A retryable cause (a signal, a lost agent) decides at once. A permanent one (exit code 1-127) waits
    until every task has ended, because the first failure seen is often a consequence: when one worker is
    killed or its machine is lost, the survivors' collectives fail with exit code 1 within seconds, before
    the lost agent is detected. A retryable cause anywhere in the gang makes the attempt retryable, and
    it is named in the reason.
    """
    causes = [t for t in attempt.tasks if _is_cause(t)]
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
        cause=_restart_cause(root),
        ending=_failure_ending(root, agent),
    )


def _failure_ending(task: Task, agent: Agent | None) -> AttemptEnding:
    """The ending an attempt gets from the task whose failure ends it: its agent lost, or its own exit."""
    if task.state == TaskState.LOST.value:
        return attempt_endings.agent_lost(task, agent)
    return attempt_endings.task_failed(task, agent.name if agent else task.agent_id)


def _restart_cause(task: Task) -> str:
    """How the task that ends its attempt is counted in mwms_job_restarts_total."""
    if task.state == TaskState.LOST.value:
        return "agent_lost"
    if task.exit_code is not None and (task.exit_code >= 128 or task.exit_code < 0):
        return "signal"
    return "exit_code" if task.exit_code else "other"

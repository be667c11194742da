"""The reconciler pass: acts on lost agents, tasks left on agents that stopped cleanly, start-up timeouts
and runtime limits.

Each agent and job is handled in its own savepoint (mwms.server.poison.isolated): a row that cannot be
handled (a limit the datetime arithmetic cannot take, a damaged option) is logged once, counted and
skipped, and every other agent and job is still handled on this pass.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from mwms.server.db.models import Agent, Attempt, Job, Task, utcnow
from mwms.server.observability.event_log import log_after_commit
from mwms.server.poison import isolated
from mwms.server.services.fleet import replicas
from mwms.server.services.fleet.agents import newly_lost_agents
from mwms.server.services.job_life import attempt_endings
from mwms.server.services.job_life.jobs import time_limit
from mwms.server.services.job_life.lifecycle import end_job, fail_attempt, mark_task_lost, preempted_seconds
from mwms.server.states import AttemptState, JobState, TaskState

log = logging.getLogger("mwms.server.reconcile")


def reconcile(
    session: Session,
    *,
    backoff_base_s: float,
    default_startup_timeout_s: float,
    moving_grace_s: float = 0.0,
    now: datetime | None = None,
) -> None:
    """One pass over everything time can change.

    An agent whose liveness ran out is judged from the replica holding its stream
    (replicas.silence_verdict): lost, not known yet (that replica has not flushed since), or moving
    because that replica died; a moving agent gets `moving_grace_s` to say hello to another replica
    before it counts as lost (once per death)."""
    now = now or utcnow()
    if moving_grace_s > 0:
        moving = replicas.release_streams_of_the_dead(session, moving_grace_s, now)
        if moving:
            log.info(
                "%d agent(s) of replicas that died are moving: %g s to reconnect", moving, moving_grace_s
            )
    for agent in newly_lost_agents(session, now):
        with isolated(session, log, "reconcile_agent", agent.id, f"lost agent {agent.name} ({agent.id})"):
            verdict = replicas.silence_verdict(session, agent, now)
            if verdict == "wait":
                continue  # its replica has not written what it heard since: the next pass knows
            if verdict == "moving" and moving_grace_s > 0:
                log.info(
                    "agent %s went silent with its replica %s: %g s to reconnect to another before it is lost",
                    agent.name,
                    agent.stream_replica,
                    moving_grace_s,
                )
                agent.online_until = now + timedelta(seconds=moving_grace_s)
                agent.stream_replica = None
                continue
            handle_lost_agent(session, agent, backoff_base_s, now)
    end_tasks_of_stopped_agents(session, backoff_base_s, now)
    _check_startup_timeouts(session, backoff_base_s, default_startup_timeout_s, now)
    _check_max_runtime(session, now)


def handle_lost_agent(session: Session, agent: Agent, backoff_base_s: float, now: datetime) -> None:
    """Marks the agent lost and every task it held LOST; their attempts end."""
    agent.lost_at = now
    tasks = session.scalars(
        select(Task).where(Task.agent_id == agent.id, Task.state.not_in(_terminal()))
    ).all()
    log_after_commit(
        session,
        f"agent {agent.name} ({agent.id}) lost: no heartbeat for {timeout_hint(agent)}; "
        f"{len(tasks)} task(s) on it lost",
        event="agent_lost",
        agent=agent.name,
        agent_id=agent.id,
        tasks_lost=len(tasks),
    )
    for task in tasks:
        mark_task_lost(
            session,
            agent,
            task,
            f"lost (its agent stopped heartbeating for {timeout_hint(agent)})",
            backoff_base_s,
            now,
        )


def end_tasks_of_stopped_agents(session: Session, backoff_base_s: float, now: datetime) -> None:
    """Ends, as a lost agent's, the tasks still open on agents that said goodbye (a clean stop): those whose
    final report did not come, and any placed on it while its goodbye was on its way. The agent itself is
    stopped, never lost (newly_lost_agents leaves it out). One query on the open tasks, whatever the number
    of stopped agents."""
    rows = session.execute(
        select(Task, Agent)
        .join(Agent, Agent.id == Task.agent_id)
        .where(Task.state.in_(_open()), Agent.stopped_at.is_not(None), Agent.removed_at.is_(None))
        .order_by(Task.agent_id, Task.id)
    ).all()
    for task, agent in rows:
        with isolated(
            session, log, "reconcile_agent", task.id, f"task {task.id} of stopped agent {agent.name}"
        ):
            mark_task_lost(
                session,
                agent,
                task,
                "lost (its agent was stopped and no longer runs it)",
                backoff_base_s,
                now,
            )


def timeout_hint(agent: Agent) -> str:
    """How long the agent has been silent, for the reason people read."""
    if agent.last_heartbeat_at is None or agent.lost_at is None:
        return "too long"
    return f"{(agent.lost_at - agent.last_heartbeat_at).total_seconds():.0f} s"


def _terminal() -> list[str]:
    return [s.value for s in TaskState if s.terminal]


def _open() -> list[str]:
    return [s.value for s in TaskState if not s.terminal]


def startup_clock(attempt: Attempt) -> datetime | None:
    """When the attempt's start-up timeout starts counting: at its creation, or once the job's own
    environment is ready on every agent; None while some task's is still building (a build is bounded
    by its agent's own limit, --env-build-timeout, not by this one)."""
    if any(task.environment == "building" for task in attempt.tasks):
        return None
    ready = [task.environment_ready_at for task in attempt.tasks if task.environment_ready_at is not None]
    return max([attempt.created_at, *ready])


def _check_startup_timeouts(session: Session, backoff_base_s: float, default_s: float, now: datetime) -> None:
    rows = session.execute(
        select(Job, Attempt)
        .join(Attempt, Attempt.job_id == Job.id)
        .where(Job.state == JobState.SCHEDULED.value, Attempt.state == AttemptState.ACTIVE.value)
    ).all()
    for job, attempt in rows:
        with isolated(session, log, "reconcile_job", job.id, f"start-up timeout of job {job.id}"):
            limit = time_limit(job, "startup_timeout_seconds", default_s)
            started = startup_clock(attempt)
            if limit is None or started is None or started + timedelta(seconds=limit) > now:
                continue
            waiting = [t.index for t in attempt.tasks if t.started_at is None]
            fail_attempt(
                session,
                job,
                attempt,
                f"workers {waiting} did not start within the start-up timeout of {limit:.0f} s",
                retryable=True,
                backoff_base_s=backoff_base_s,
                now=now,
                cause="startup_timeout",
                ending=attempt_endings.startup_timeout(waiting, limit),
            )


def _check_max_runtime(session: Session, now: datetime) -> None:
    jobs = session.scalars(
        select(Job).where(
            Job.state.not_in([s.value for s in JobState if s.terminal]), Job.started_at.is_not(None)
        )
    ).all()
    for job in jobs:
        with isolated(session, log, "reconcile_job", job.id, f"runtime limit of job {job.id}"):
            limit = time_limit(job, "max_runtime_seconds")
            if limit and job.started_at is not None and job.started_at + timedelta(seconds=limit) <= now:
                limit += preempted_seconds(job, now)  # time spent preempted is not run time
            if limit and job.started_at is not None and job.started_at + timedelta(seconds=limit) <= now:
                end_job(
                    session,
                    job,
                    JobState.FAILED,
                    f"ran longer than max_runtime_seconds={limit:g}; stopped",
                    now,
                    attempt_endings.runtime_limit(limit),
                )

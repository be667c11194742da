"""Agent credentials and what an agent may do: admission at Register, authentication of every other call,
and the ownership rules for bundles, checkpoints and uploads.

A credential is `mwmsa_<agent id>.<secret>`; only the sha256 of the secret is stored (Agent.credential_hash).
A name that holds a credential belongs to whoever presents it: a join token admits new names (and names an
admin removed), never takes over a live one.
"""

from __future__ import annotations

import re
import secrets
from datetime import datetime
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from mwms.server.db.models import Agent, Job, Task
from mwms.server.errors import DomainError, Forbidden, InvalidInput, NotFound, Unauthenticated
from mwms.server.observability.instruments import count_registration
from mwms.server.services.auth.tokens import (
    SECRET_BYTES,
    has_usable_join_token,
    hash_secret,
    join_token_valid,
    same_secret_hash,
)
from mwms.server.services.fleet.agents import Registration, register_agent, validate_registration
from mwms.server.services.storage import files
from mwms.server.services.storage.bundles import bundle_path
from mwms.server.states import TaskState

CREDENTIAL_PREFIX = "mwmsa_"
# Where the agent keeps its credential, for messages (the agent owns the file: worker_agent/credentials.py).
CREDENTIAL_FILE_HINT = "<agent work dir>/agent-credential"
MAX_CREDENTIAL_LENGTH = 200
_ID = re.compile(r"[0-9a-f]{12}")
_DIGEST = re.compile(r"[0-9a-f]{64}")
_LIVE_TASK_STATES = [s.value for s in TaskState if not s.terminal]


def issue_credential(agent: Agent) -> str:
    """A new credential for `agent`; any earlier one stops working. The secret is not kept."""
    secret = secrets.token_urlsafe(SECRET_BYTES)
    agent.credential_hash = hash_secret(secret)
    return f"{CREDENTIAL_PREFIX}{agent.id}.{secret}"


def parse_credential(credential: str) -> tuple[str, str]:
    """(agent id, secret) of a credential; Unauthenticated when it is not one."""
    body = credential.removeprefix(CREDENTIAL_PREFIX)
    agent_id, _, secret = body.partition(".")
    if (
        len(credential) > MAX_CREDENTIAL_LENGTH
        or not credential.startswith(CREDENTIAL_PREFIX)
        or not agent_id
        or not secret
    ):
        raise Unauthenticated(
            f"the agent credential is malformed: delete {CREDENTIAL_FILE_HINT} and start the agent with a "
            "join token to join again"
        )
    return agent_id, secret


def _void_credential(agent: Agent) -> Unauthenticated:
    return Unauthenticated(
        f"the credential of agent {agent.name!r} is no longer valid (an admin removed the agent or it "
        f"joined again elsewhere): delete {CREDENTIAL_FILE_HINT} and start the agent with a join token "
        "to join again"
    )


def _verified(session: Session, credential: str) -> Agent | None:
    """The agent a credential proves, None when it names an agent this coordinator never had."""
    agent_id, secret = parse_credential(credential)
    agent = session.get(Agent, agent_id)
    if agent is None:
        return None
    if agent.removed_at is not None or agent.credential_hash is None:
        raise _void_credential(agent)
    if not same_secret_hash(hash_secret(secret), agent.credential_hash):
        raise _void_credential(agent)
    return agent


def authenticate_agent(session: Session, credential: str) -> str:
    """The id of the agent `credential` proves; Unauthenticated for none, unknown, revoked or wrong ones."""
    if not credential:
        raise Unauthenticated(
            "no agent credential: an agent gets one from Register and sends it as "
            "'authorization: Bearer <credential>' on every call"
        )
    agent = _verified(session, credential)
    if agent is None:
        raise Unauthenticated("the credential names an agent this coordinator does not know: register again")
    return agent.id


def known_registration(session: Session, reg: Registration, credential: str) -> Agent | None:
    """The agent `credential` proves when it registers again exactly as it is on record and is not lost
    (a reconnect after a replica died, or after a coordinator restart): nothing to write, and its hello,
    which follows at once, marks it alive. None: register it for real (admit_agent), which also gives
    every refusal its proper error. With replicas, a failover's hundreds of reconnects each save one
    serialised write this way."""
    if not credential:
        return None
    validate_registration(reg)
    try:
        agent = _verified(session, credential)
    except DomainError:
        return None
    if agent is None or agent.name != reg.name or agent.lost_at is not None:
        return None
    on_record = (
        agent.hostname,
        agent.advertise_address,
        agent.port_low,
        agent.port_high,
        agent.devices,
        agent.version,
        agent.task_isolation,
        agent.memory_bytes,
    )
    wanted = (
        reg.hostname,
        reg.advertise_address,
        reg.port_low,
        reg.port_high,
        reg.devices,
        reg.version,
        reg.task_isolation,
        reg.memory_bytes,
    )
    if on_record != wanted:
        return None
    count_registration(session)
    return agent


def admit_agent(
    session: Session,
    reg: Registration,
    *,
    credential: str,
    join_token: str,
    bootstrap_join_token: str,
    timeout_s: float,
    connected: frozenset[str] = frozenset(),
    now: datetime | None = None,
) -> tuple[Agent, str]:
    """Registers an agent; returns it with a new credential, or "" when it proved itself with its own.

    The agent holding a name re-registers with its credential, no join token needed. A name with a live
    credential is refused to everyone else (Forbidden). A new name, a removed agent's name or one that was
    never given a credential joins with a valid join token and gets a new credential.
    """
    validate_registration(reg)
    caller = _verified(session, credential) if credential else None
    holder = session.scalars(select(Agent).where(Agent.name == reg.name)).one_or_none()
    if holder is not None and caller is not None and caller.id == holder.id:
        return register_agent(session, reg, timeout_s, now, connected), ""
    if holder is not None and holder.credential_hash is not None and holder.removed_at is None:
        raise Forbidden(
            f"agent name {reg.name!r} belongs to a registered agent (id {holder.id}): start that agent with "
            f"the credential from its work dir ({CREDENTIAL_FILE_HINT}), pick another --name, or have an "
            f"admin remove the agent (`mwms remove-agent {holder.id}`) so the name can join again"
        )
    if not join_token_valid(session, join_token, bootstrap_join_token):
        if not bootstrap_join_token and not has_usable_join_token(session, now):
            raise Unauthenticated(
                "the coordinator has no join token, so no new agent can join: an admin creates one with "
                "`mwms agent-token create` (or starts the coordinator with MWMS_JOIN_TOKEN); then start this "
                "agent with MWMS_JOIN_TOKEN or --join-token-file"
            )
        raise Unauthenticated(
            "wrong, revoked or missing join token: start the agent with MWMS_JOIN_TOKEN (or --join-token-file) "
            "set to a token from `mwms agent-token create` or the coordinator's MWMS_JOIN_TOKEN"
        )
    agent = register_agent(session, reg, timeout_s, now, connected)
    agent.removed_at = None
    new_credential = issue_credential(agent)
    session.flush()
    return agent, new_credential


def check_id(value: str, what: str) -> str:
    """`value` when it is an id as the coordinator makes them (12 lowercase hex); InvalidInput otherwise."""
    if not _ID.fullmatch(value):
        raise InvalidInput(f"{what} {value[:40]!r} is not an id: ids are 12 lowercase hex characters")
    return value


def check_digest(value: str) -> str:
    if not _DIGEST.fullmatch(value):
        raise InvalidInput(f"bundle digest {value[:80]!r} is not a sha256: 64 lowercase hex characters")
    return value


def _has_live_task(session: Session, agent_id: str, *conditions: object) -> bool:
    query = (
        select(Task.id)
        .join(Job, Job.id == Task.job_id)
        .where(Task.agent_id == agent_id, Task.state.in_(_LIVE_TASK_STATES), *conditions)  # type: ignore[arg-type]
        .limit(1)
    )
    return session.scalar(query) is not None


def bundle_for_agent(session: Session, bundle_dir: Path, agent_id: str, digest: str) -> Path:
    """The bundle archive `digest`, if a live task placed on the agent runs it; Forbidden otherwise."""
    check_digest(digest)
    if not _has_live_task(session, agent_id, Job.bundle_digest == digest):
        raise Forbidden(
            f"bundle {digest[:12]} belongs to no live task of this agent: an agent fetches only the "
            "bundles of tasks placed on it"
        )
    return bundle_path(session, bundle_dir, digest)


def checkpoint_for_agent(session: Session, files_dir: Path, agent_id: str, job_id: str) -> Path | None:
    """The job's latest checkpoint archive (None when there is none), if a live task of it is on the agent."""
    check_id(job_id, "job id")
    if not _has_live_task(session, agent_id, Task.job_id == job_id):
        raise Forbidden(
            f"job {job_id} has no live task on this agent: an agent restores checkpoints only for tasks "
            "placed on it"
        )
    return files.latest_checkpoint(session, files_dir, job_id)


def task_for_upload(session: Session, agent_id: str, task_id: str, checkpoint: bool) -> Task:
    """The agent's own task to attach uploaded files to.

    Artifacts arrive after a task ended, so ownership is the rule; a checkpoint must also come from the
    job's current attempt, or it would replace a newer one.
    """
    check_id(task_id, "task id")
    task = session.get(Task, task_id)
    if task is None:
        raise NotFound(f"no task {task_id} to attach files to")
    if task.agent_id != agent_id:
        raise Forbidden(
            f"task {task_id} was placed on another agent: an agent uploads files only for its own tasks"
        )
    if checkpoint:
        files.ensure_current_attempt(session, task)
    return task

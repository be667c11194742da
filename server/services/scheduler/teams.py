"""Teams and their quotas: which team a user's jobs count against, and how much of the cluster it may use.

Admin-managed. A user who belongs to no team is a team of their own, named after them, so every job
has a team and fair share treats a lone user like any other team. A quota caps the GPUs and the CPU
slots the team's running jobs hold at once; None means no cap of that kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from mwms.server.db.models import Job, Task, TeamMember, TeamQuota, utcnow
from mwms.server.errors import InvalidInput, NotFound
from mwms.server.limits import MAX_NAME_CHARS
from mwms.server.schemas import MAX_QUOTA_DEVICES
from mwms.server.states import DEVICE_HOLDING_TASK_STATES

MAX_TEAMS_LISTED = 10_000


@dataclass(frozen=True)
class Quota:
    team: str
    gpus: int | None
    cpu_slots: int | None

    def limit(self, kind: str) -> int | None:
        """The cap for a device kind ("gpu" or "cpu"), None when there is none."""
        return self.gpus if kind == "gpu" else self.cpu_slots


def team_of(session: Session, user: str) -> str:
    """The team `user` belongs to, else the user's own name (a team of one)."""
    member = session.get(TeamMember, user)
    return member.team if member is not None else user


def check_name(value: str, what: str) -> str:
    """A team or user name as given, or InvalidInput saying what a valid one looks like."""
    name = value.strip()
    if not name or len(name) > MAX_NAME_CHARS or not name.isprintable():
        raise InvalidInput(f"{what} must be 1-{MAX_NAME_CHARS} printable characters, got {value!r}")
    return name


def add_member(session: Session, team: str, user: str, by: str, now: datetime | None = None) -> TeamMember:
    """Puts `user` in `team` (moving them out of any other); jobs submitted from now on count against it."""
    team, user = check_name(team, "a team name"), check_name(user, "a user name")
    member = session.get(TeamMember, user)
    if member is None:
        member = TeamMember(user=user, team=team, added_by=by, added_at=now or utcnow())
        session.add(member)
    else:
        member.team, member.added_by, member.added_at = team, by, now or utcnow()
    session.flush()
    return member


def remove_member(session: Session, team: str, user: str) -> None:
    """Takes `user` out of `team`: they are a team of their own again."""
    member = session.get(TeamMember, user)
    if member is None or member.team != team:
        raise NotFound(f"user {user!r} is not in team {team!r}; see `mwms team list`")
    session.delete(member)
    session.flush()


def set_quota(
    session: Session,
    team: str,
    gpus: int | None,
    cpu_slots: int | None,
    by: str,
    now: datetime | None = None,
) -> Quota:
    """Sets (replaces) the team's quota; None for a kind removes its cap."""
    team = check_name(team, "a team name")
    for field, value in (("gpus", gpus), ("cpu_slots", cpu_slots)):
        if value is not None and not 0 <= value <= MAX_QUOTA_DEVICES:
            raise InvalidInput(f"{field} must be between 0 and {MAX_QUOTA_DEVICES}, got {value}")
    row = session.get(TeamQuota, team)
    if row is None:
        row = TeamQuota(team=team)
        session.add(row)
    row.gpus, row.cpu_slots, row.set_by, row.set_at = gpus, cpu_slots, by, now or utcnow()
    session.flush()
    return Quota(team, gpus, cpu_slots)


def clear_quota(session: Session, team: str) -> None:
    row = session.get(TeamQuota, team)
    if row is None:
        raise NotFound(f"team {team!r} has no quota; see `mwms team list`")
    session.delete(row)
    session.flush()


def quotas(session: Session) -> dict[str, Quota]:
    """Every team's quota, by team."""
    return {
        row.team: Quota(row.team, row.gpus, row.cpu_slots)
        for row in session.scalars(select(TeamQuota).limit(MAX_TEAMS_LISTED))
    }


def members(session: Session) -> dict[str, list[str]]:
    """Every team's members, by team, sorted."""
    teams: dict[str, list[str]] = {}
    for row in session.scalars(select(TeamMember).order_by(TeamMember.team, TeamMember.user)):
        teams.setdefault(row.team, []).append(row.user)
    return teams


def usage(session: Session) -> dict[str, dict[str, int]]:
    """Devices each team's jobs hold now, by team then kind: {"gpu": GPUs, "cpu": CPU slots}.

    Tasks hold their devices until they have ended (LOST ones until their agent confirms), as placement
    counts them.
    """
    rows = session.execute(
        select(Job.team, Task.device_kind, Task.device_indices)
        .join(Job, Job.id == Task.job_id)
        .where(Task.state.in_(DEVICE_HOLDING_TASK_STATES))
    ).all()
    used: dict[str, dict[str, int]] = {}
    for team, kind, indices in rows:
        per_team = used.setdefault(team, {"gpu": 0, "cpu": 0})
        per_team[kind if kind == "gpu" else "cpu"] += len(indices) if kind == "gpu" else 1
    return used

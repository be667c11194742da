"""Agents found by reference (an id or a name) in the database, by the one rule in mwms/agent_references.py.

Every lookup of "an agent's id or name" goes through here: the REST `/agents/{agent}` routes, the job spec's
`agents` pins at submit, and the pins at placement (`pin_candidates` feeds services.scheduler.placement.place_pinned).
Only agents an admin has not removed take part, so removing an agent whose name clashes with another's id
ends the ambiguity.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from mwms.agent_references import AmbiguousAgent, UnknownAgent, resolve_agent_reference
from mwms.server.db.models import Agent
from mwms.server.errors import InvalidInput, NotFound


def _candidates(session: Session, references: Sequence[str]) -> list[Agent]:
    """Agents not removed whose id or name is one of `references` (two indexed lookups, one query)."""
    if not references:
        return []
    return list(
        session.scalars(
            select(Agent).where(
                Agent.removed_at.is_(None),
                or_(Agent.id.in_(references), Agent.name.in_(references)),
            )
        ).all()
    )


def find_agent(session: Session, reference: str) -> Agent:
    """The agent `reference` names (its id, else its name); NotFound for none, InvalidInput when ambiguous."""
    rows = _candidates(session, [reference])
    try:
        agent_id = resolve_agent_reference(((a.id, a.name) for a in rows), reference)
    except UnknownAgent as error:
        raise NotFound(f"{error} (GET /api/v1/agents lists them)") from None
    except AmbiguousAgent as error:
        raise InvalidInput(str(error)) from None
    return next(a for a in rows if a.id == agent_id)


def pin_candidates(session: Session, pins: Iterable[str]) -> list[tuple[str, str]]:
    """(id, name) of every agent a job's pins could mean, online or not, for place_pinned to resolve."""
    return [(a.id, a.name) for a in _candidates(session, sorted(set(pins)))]


def check_pins(session: Session, pins: Sequence[str] | None) -> None:
    """InvalidInput for a pin that could mean two agents; an unknown one is accepted (the job waits for it)."""
    if not pins:
        return
    known = pin_candidates(session, pins)
    for index, pin in enumerate(pins):
        try:
            resolve_agent_reference(known, pin)
        except UnknownAgent:
            continue
        except AmbiguousAgent as error:
            raise InvalidInput(f"agents[{index}]: {error}") from None

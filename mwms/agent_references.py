"""Agent references: which one agent a name or id picks, for the coordinator and the CLI alike.

Dependency-free, so both sides apply one rule. An agent's id is what the coordinator makes
(12 lowercase hex characters, server/db/models.new_id); its name is what the agent was started with,
and a name may not have the form of an id (the coordinator refuses such a name at registration,
`name_has_id_form`), so ids and names never overlap from then on.

A reference (a job's `agents` pin, `mwms remove-agent X`, `/api/v1/agents/X`) is resolved ids first:
the agent whose id it is, else the agent whose name it is. A value that is one agent's id and another's
name, or the name of several agents, is refused (`AmbiguousAgent`): guessing could hand a job and its
environment secrets to the wrong machine. Names and ids compare exactly (case matters). The coordinator
resolves among the agents an admin has not removed, so removing the agent with the offending name ends
the ambiguity (and that name cannot join again).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

AGENT_ID_LENGTH = 12
# Upper case too: "ABCDEF012345" in a list reads as an id to a person, whatever the lookup does.
_ID_FORM = re.compile(rf"[0-9a-fA-F]{{{AGENT_ID_LENGTH}}}")
NAME_WITH_ID_FORM_HELP = (
    f"it has the form of an agent id ({AGENT_ID_LENGTH} hex characters), so jobs and commands could "
    "mistake it for another agent's id: start the agent with another --name (one with a letter "
    "outside a-f, a dash or another length)"
)


class AgentReferenceError(ValueError):
    """A reference that picks no agent or more than one; the message says which and what to do."""


class UnknownAgent(AgentReferenceError):
    """No agent has this id or name."""


class AmbiguousAgent(AgentReferenceError):
    """The value is one agent's id and another's name, or several agents' name."""


def name_has_id_form(name: str) -> bool:
    """True when `name` looks like an agent id, which a name may not."""
    return _ID_FORM.fullmatch(name) is not None


def resolve_agent_reference(agents: Iterable[tuple[str, str]], reference: str) -> str:
    """The id of the one agent among `agents` ((id, name) pairs) that `reference` names, ids first.

    UnknownAgent when none matches; AmbiguousAgent when the value is an id and also another agent's
    name, or when it matches no id and names several agents.
    """
    by_id = []
    by_name = []
    for agent_id, name in agents:
        if agent_id == reference:
            by_id.append(agent_id)
        if name == reference:
            by_name.append((agent_id, name))
    others = [agent_id for agent_id, _ in by_name if agent_id not in by_id]
    if by_id and not others:
        return by_id[0]
    if by_id:
        raise AmbiguousAgent(
            f"{reference!r} is the id of one agent and the name of another (id {others[0]}), a name "
            f"agents may no longer take: remove that agent (`mwms remove-agent {others[0]}`) and start it "
            "again with another --name"
        )
    if len(by_name) == 1:
        return by_name[0][0]
    if by_name:
        ids = ", ".join(sorted(agent_id for agent_id, _ in by_name))
        raise AmbiguousAgent(f"several agents are named {reference!r} (ids {ids}): pass the id instead")
    raise UnknownAgent(f"no agent has the id or name {reference!r}; see `mwms agents`")

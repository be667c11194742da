"""Sharing the cluster: the queue, teams and quotas, cordons and drains, and the agents they act on.

`SharingMethods` holds the methods `Client` offers for them (mixed into `Client`, which stays the one way
in). Reading is for every role; changing teams, quotas and agents is an admin's (others get `Forbidden`).
"""

from __future__ import annotations

from mwms.client.models import Agent, QueueEntry, Team
from mwms.client.pages import QueuePage
from mwms.client.rest import RestApi

QUEUE_PAGE = 500  # the most GET /api/v1/queue answers at once


class SharingMethods:
    """`Client`'s methods for the queue, teams, quotas and agents (see `Client`)."""

    rest: RestApi

    # -- the queue ---------------------------------------------------------------------------------------

    def queue(self) -> list[QueueEntry]:
        """Every waiting job in the order the scheduler places them, with why each waits."""
        entries: list[QueueEntry] = []
        while True:
            page = self.queue_page(offset=len(entries), limit=QUEUE_PAGE)
            entries += page.entries
            if not page.entries or len(entries) >= page.total:
                return entries

    def queue_page(self, *, offset: int = 0, limit: int = 100) -> QueuePage:
        """One page of the queue: `limit` (at most 500) waiting jobs after the first `offset`, and how many
        wait in all."""
        return QueuePage.from_api(self.rest.queue(offset=offset, limit=limit))

    # -- teams and quotas (changes: admin only) ----------------------------------------------------------

    def teams(self) -> list[Team]:
        """Every team with members, a quota or jobs holding devices."""
        return [Team.from_api(raw) for raw in self.rest.list_teams()]

    def add_team_member(self, team: str, user: str) -> Team:
        """Puts `user` in `team` (out of any other): the jobs they submit from now on count against it."""
        return Team.from_api(self.rest.add_team_member(team, user))

    def remove_team_member(self, team: str, user: str) -> Team:
        """Takes `user` out of `team`: they are a team of their own again."""
        return Team.from_api(self.rest.remove_team_member(team, user))

    def set_quota(self, team: str, *, gpus: int | None = None, cpu_slots: int | None = None) -> Team:
        """Sets (replaces) `team`'s quota; a kind left None has no cap."""
        return Team.from_api(self.rest.set_quota(team, gpus, cpu_slots))

    def clear_quota(self, team: str) -> Team:
        """Removes `team`'s quota."""
        return Team.from_api(self.rest.clear_quota(team))

    # -- agents, cordons and drains (changes: admin only) ------------------------------------------------

    def agents(self) -> list[Agent]:
        """The agents the coordinator knows: online or lost, their devices and running tasks."""
        return [Agent.from_api(raw) for raw in self.rest.list_agents()]

    def cordon(self, agent: str, reason: str = "") -> Agent:
        """Cordons an agent (its name or id): nothing new is placed on it; what it runs keeps running."""
        return Agent.from_api(self.rest.cordon_agent(agent, reason))

    def uncordon(self, agent: str) -> Agent:
        """Ends an agent's cordon or drain: jobs may be placed on it again."""
        return Agent.from_api(self.rest.uncordon_agent(agent))

    def drain(
        self, agent: str, reason: str = "", *, grace_seconds: int | None = None, let_finish: bool = False
    ) -> Agent:
        """Drains an agent: cordons it and preempts the jobs it runs (SIGTERM, `grace_seconds`, SIGKILL),
        which then wait for other agents; with `let_finish` they run to their end. `Agent.drained` turns
        True once nothing runs there (poll `agents()`)."""
        return Agent.from_api(self.rest.drain_agent(agent, reason, grace_seconds, let_finish))

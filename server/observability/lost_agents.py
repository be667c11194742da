"""`mwms_agent_lost{agent=...}`: 1 for each agent the coordinator holds as lost, so an alert can name it.

Lost is the liveness the API and `mwms_agents{state="lost"}` derive (services.fleet.agents.agent_state,
services.observing.cluster_counts): not removed by an admin, not online (online_until has passed) and not stopped. An
agent that comes back (online again) or that an admin removes loses its series, so an alert on it clears. Only lost agents have a series, and at most
MAX_LOST_AGENTS_LABELLED of them (by name, so the same ones stay listed from scrape to scrape);
`mwms_agents{state="lost"}` still counts every one. One indexed read in the scrape's transaction.

An agent that stopped cleanly (`systemctl stop`) says goodbye as its last message
(worker_agent/connection.py) and reads as stopped (agents.stopped_at), never lost: it has no series, and
MwmsAgentLost does not fire for it. One that dies, or is cut off, says nothing and is lost once the agent
timeout passes, as is an agent that stops while it cannot reach the coordinator.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from mwms.server.db.models import Agent, utcnow

# Far above the agents an operator looks at one by one; bounds the series a mass outage creates.
MAX_LOST_AGENTS_LABELLED = 100


def lost_agent_names(session: Session, limit: int, now: datetime | None = None) -> list[str]:
    """Names of the first `limit` agents (by name) that are neither removed, nor online, nor stopped."""
    now = now or utcnow()
    lost = (
        Agent.removed_at.is_(None)
        & Agent.stopped_at.is_(None)
        & or_(Agent.online_until.is_(None), Agent.online_until <= now)
    )
    return list(session.scalars(select(Agent.name).where(lost).order_by(Agent.name).limit(limit)))


def lost_agent_gauge(names: list[str]) -> Iterator[Metric]:
    """The gauge, one series per lost agent named (none when every agent is online, stopped or removed)."""
    gauge = GaugeMetricFamily(
        "mwms_agent_lost",
        "1 for each agent that is lost (not heard from within the agent timeout, not stopped cleanly, not "
        f"removed); at most {MAX_LOST_AGENTS_LABELLED} agents, by name; "
        'mwms_agents{state="lost"} counts them all',
        labels=["agent"],
    )
    for name in names:
        gauge.add_metric([name], 1)
    yield gauge

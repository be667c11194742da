"""A reconnect that changes nothing is answered from a read (services/agent_auth.known_registration):
with replicas, a failover's hundreds of reconnects each skip one serialised write."""

from __future__ import annotations

from dataclasses import replace

from mwms.server.db.models import Agent, utcnow
from mwms.server.services.fleet.agent_auth import admit_agent, known_registration
from mwms.server.services.fleet.agents import Registration

REG = Registration(
    "kr-1", "host-a", "127.0.0.1", 20000, 20010, [{"kind": "cpu", "index": 0, "name": "s"}], "t"
)


def test_only_an_unchanged_live_agent_proving_itself_skips_the_write(db):
    with db.write() as session:
        agent, credential = admit_agent(
            session, REG, credential="", join_token="j", bootstrap_join_token="j", timeout_s=30
        )
    with db.read() as session:
        assert known_registration(session, REG, credential).id == agent.id
        assert known_registration(session, replace(REG, port_high=20020), credential) is None  # changed
        assert known_registration(session, replace(REG, hostname="host-b"), credential) is None
        assert known_registration(session, REG, "") is None  # a join: the write path
        assert known_registration(session, REG, f"{agent.id}.wrong-secret") is None  # refused there
        assert known_registration(session, REG, "not a credential") is None
    with db.write() as session:
        session.get(Agent, agent.id).lost_at = utcnow()
    with db.read() as session:
        assert known_registration(session, REG, credential) is None  # a lost agent registers for real

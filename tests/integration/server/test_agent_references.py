"""Issue 16 item 6: agent identities are unambiguous. A name may not look like an id (refused at Register),
and every "id or name" (job pins at submit and at placement, the REST /agents/{agent} routes, the CLI)
resolves ids first with one rule (mwms/agent_references.py), refusing a value that could mean two agents.

The attack this closes: a rogue agent named like a real agent's id got the job pinned to that id, and with
it the job's environment secrets.
"""

from __future__ import annotations

import grpc
import pytest
from sqlalchemy import select
from test_agent_rpc_auth import Coordinator, refusal, start_coordinator  # noqa: F401 - fixture

from mwms.agent_references import (
    AmbiguousAgent,
    UnknownAgent,
    name_has_id_form,
    resolve_agent_reference,
)
from mwms.cli.admin_commands import find_agent as cli_find_agent
from mwms.cli.errors import CliError, ExitCode
from mwms.server.db.engine import Database
from mwms.server.db.models import Agent, Bundle, Job, Task, new_id
from mwms.server.errors import InvalidInput, NotFound
from mwms.server.schemas import JobCreate
from mwms.server.services.fleet.agent_references import find_agent
from mwms.server.services.fleet.agents import remove_agent, touch_agent
from mwms.server.services.job_life.jobs import create_job
from mwms.server.services.scheduler.placement import AgentCapacity, NoFit, place_pinned
from mwms.server.services.scheduler.scheduling import schedule_pending

DIGEST = "d" * 64
SLOT = [{"kind": "cpu", "index": 0, "name": "s"}]


# --- the rule -------------------------------------------------------------------------------------------


def test_every_id_the_coordinator_makes_has_the_form_a_name_may_not_take() -> None:
    assert all(name_has_id_form(new_id()) for _ in range(200))
    for name in ("0123456789ab", "ABCDEF012345", "deadbeefcafe"):
        assert name_has_id_form(name), name
    for name in ("gpu-1", "0123456789abc", "0123456789a", "0123456789ag", "node-0123456789", ""):
        assert not name_has_id_form(name), name


def test_ids_come_first_and_a_value_that_could_mean_two_agents_is_refused() -> None:
    agents = [("aaaaaaaaaaaa", "gpu-1"), ("bbbbbbbbbbbb", "gpu-2")]
    assert resolve_agent_reference(agents, "bbbbbbbbbbbb") == "bbbbbbbbbbbb"
    assert resolve_agent_reference(agents, "gpu-1") == "aaaaaaaaaaaa"
    with pytest.raises(UnknownAgent, match="no agent has the id or name 'gpu-3'; see `mwms agents`"):
        resolve_agent_reference(agents, "gpu-3")
    # An agent named like itself is no clash (its id and name both mean it).
    assert resolve_agent_reference([("aaaaaaaaaaaa", "aaaaaaaaaaaa")], "aaaaaaaaaaaa") == "aaaaaaaaaaaa"

    rogue = [*agents, ("cccccccccccc", "aaaaaaaaaaaa")]  # named like gpu-1's id (an old row)
    with pytest.raises(AmbiguousAgent, match=r"id of one agent and the name of another \(id cccccccccccc\)"):
        resolve_agent_reference(rogue, "aaaaaaaaaaaa")
    with pytest.raises(AmbiguousAgent, match="mwms remove-agent cccccccccccc"):
        resolve_agent_reference(rogue, "aaaaaaaaaaaa")
    assert resolve_agent_reference(rogue, "cccccccccccc") == "cccccccccccc"
    twins = [*agents, ("dddddddddddd", "gpu-1")]
    with pytest.raises(AmbiguousAgent, match="several agents are named 'gpu-1'.*pass the id"):
        resolve_agent_reference(twins, "gpu-1")


def test_the_cli_resolves_with_the_same_rule() -> None:
    listed = [{"id": "aaaaaaaaaaaa", "name": "gpu-1"}, {"id": "cccccccccccc", "name": "aaaaaaaaaaaa"}]
    assert cli_find_agent(listed, "gpu-1")["id"] == "aaaaaaaaaaaa"
    assert cli_find_agent(listed, "cccccccccccc")["name"] == "aaaaaaaaaaaa"
    with pytest.raises(CliError) as ambiguous:
        cli_find_agent(listed, "aaaaaaaaaaaa")
    assert (
        ambiguous.value.code == ExitCode.USAGE and "mwms remove-agent cccccccccccc" in ambiguous.value.message
    )
    with pytest.raises(CliError) as unknown:
        cli_find_agent(listed, "gpu-9")
    assert unknown.value.code == ExitCode.NOT_FOUND and "mwms agents" in unknown.value.message


def capacity(agent_id: str, name: str) -> AgentCapacity:
    return AgentCapacity(agent_id, name, f"{name}.local", "cpu", (0,), (0,), 20000, 20009)


def test_place_pinned_resolves_among_all_known_agents_not_only_the_online_ones() -> None:
    real, rogue = ("aaaaaaaaaaaa", "gpu-1"), ("cccccccccccc", "aaaaaaaaaaaa")
    # The real agent is offline: only the rogue is offered, but the pin names the real agent's id.
    placed = place_pinned([capacity(*rogue)], ["aaaaaaaaaaaa"], 0, known=[real, rogue])
    assert isinstance(placed, NoFit) and "cannot be told apart" in placed.reason
    # Without the rogue, the pin waits for the real agent instead of landing anywhere else.
    waiting = place_pinned([capacity("eeeeeeeeeeee", "other")], ["aaaaaaaaaaaa"], 0, known=[real])
    assert isinstance(waiting, NoFit) and "aaaaaaaaaaaa is offline or unknown" in waiting.reason
    placed = place_pinned([capacity(*real)], ["aaaaaaaaaaaa", "gpu-1"], 0, known=[real])
    assert isinstance(placed, NoFit)  # one slot, two workers: waits for capacity on the one agent
    assert "waiting for capacity on agent gpu-1" in placed.reason


# --- in the database: submit, placement, removal --------------------------------------------------------


# What the shared `db` fixture (tests/conftest.py) holds.
pytestmark = pytest.mark.db_seed(DIGEST, agents=("real", "bystander"))


def agent_id_of(db: Database, name: str) -> str:
    with db.read() as session:
        return session.scalars(select(Agent.id).where(Agent.name == name)).one()


def add_old_rogue_row(db: Database, name: str) -> str:
    """An online agent named `name`, written straight into the database as registration once allowed."""
    with db.write() as session:
        rogue = Agent(
            name=name,
            hostname="rogue",
            advertise_address="10.6.6.6",
            port_low=20000,
            port_high=20010,
            devices=SLOT,
            version="t",
        )
        session.add(rogue)
        touch_agent(rogue, 30)
        session.flush()
        return rogue.id


def spec(*agents: str) -> JobCreate:
    return JobCreate(
        bundle_digest=DIGEST,
        command=["python", "train.py"],
        workers=len(agents),
        env={"SECRET": "for the real agent only"},
        agents=list(agents),
    )


def test_a_rogue_named_like_the_real_agents_id_never_gets_the_pinned_job(db: Database) -> None:
    real = agent_id_of(db, "real")
    with db.write() as session:
        job_id = create_job(session, spec(real)).id
    rogue = add_old_rogue_row(db, real)
    with db.write() as session:  # the real agent went offline; the rogue is online and free
        agent = session.get(Agent, real)
        assert agent is not None
        agent.online_until = None

    with db.write() as session:
        assert schedule_pending(session) == []
    with db.write() as session:
        session.get(Agent, real).online_until = session.get(Agent, rogue).online_until  # type: ignore[union-attr]
    with db.write() as session:
        assert schedule_pending(session) == []  # both online: still refused, not guessed
    with db.read() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.state == "PENDING"
        assert "cannot be told apart" in job.reason and f"mwms remove-agent {rogue}" in job.reason
        assert session.scalars(select(Task).where(Task.agent_id == rogue)).all() == []

    # Submitting such a pin is refused outright, saying which index and what to do.
    with pytest.raises(InvalidInput, match=rf"agents\[1\]: '{real}' is the id of one agent"), db.write() as s:
        create_job(s, spec("bystander", real))
    # The way out the message gives: remove the rogue by its id; the pin then means the real agent.
    with db.write() as session:
        remove_agent(session, rogue, backoff_base_s=1)
    with db.write() as session:
        assert schedule_pending(session) == [real]
    with db.read() as session:
        [task] = session.scalars(select(Task).where(Task.job_id == job_id)).all()
        assert task.agent_id == real


def test_pins_by_name_and_lookups_by_name_or_id_still_work(db: Database) -> None:
    real, bystander = agent_id_of(db, "real"), agent_id_of(db, "bystander")
    with db.write() as session:
        create_job(session, spec("bystander", real))
        assert schedule_pending(session) == sorted([real, bystander])
        assert find_agent(session, "real").id == real
        assert find_agent(session, real).name == "real"
        with pytest.raises(NotFound, match="no agent has the id or name 'ghost'"):
            find_agent(session, "ghost")
        remove_agent(session, "bystander", backoff_base_s=1)
        with pytest.raises(NotFound):  # a removed agent is out of every lookup
            find_agent(session, bystander)


# --- on a real coordinator: Register and the REST routes ------------------------------------------------


@pytest.fixture
def coordinator(start_coordinator) -> Coordinator:  # noqa: F811 - the fixture imported above
    return start_coordinator()


def test_register_refuses_a_name_with_the_form_of_an_id(coordinator: Coordinator) -> None:
    real = coordinator.register("real")
    for name in (real.agent_id, "0123456789ab", "DEADBEEFCAFE"):
        error = refusal(lambda n=name: coordinator.register(n))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, error.details())
        assert "form of an agent id" in error.details() and "--name" in error.details()
    with coordinator.db.read() as session:
        assert session.scalars(select(Agent.name)).all() == ["real"]


def test_rest_agent_routes_take_an_id_or_a_name_and_refuse_an_ambiguous_one(coordinator: Coordinator) -> None:
    real = coordinator.register("real").agent_id
    http = coordinator.http
    by_name = http.get("/api/v1/agents/real/devices")
    assert by_name.status_code == 200 and by_name.json()["agent_id"] == real
    assert http.get(f"/api/v1/agents/{real}/devices").json()["agent_id"] == real
    assert http.get("/api/v1/agents/ghost/devices").status_code == 404

    with coordinator.db.write() as session:  # an old row named like the real agent's id
        rogue = Agent(name=real, hostname="rogue", advertise_address="10.6.6.6", port_low=1, port_high=2)
        session.add(rogue)
        session.flush()
        rogue_id = rogue.id
    for response in (http.get(f"/api/v1/agents/{real}/devices"), http.delete(f"/api/v1/agents/{real}")):
        assert response.status_code == 400, response.text
        assert f"mwms remove-agent {rogue_id}" in response.json()["detail"]
    with coordinator.db.write() as session:
        session.add(Bundle(digest=DIGEST, size=1, archive_format="tar.gz"))
    body = {"bundle_digest": DIGEST, "command": ["python", "x.py"], "workers": 1, "agents": [real]}
    submitted = http.post("/api/v1/jobs", json=body)
    assert submitted.status_code == 400 and "agents[0]" in submitted.json()["detail"], submitted.text

    removed = http.delete(f"/api/v1/agents/{rogue_id}")
    assert removed.status_code == 200 and removed.json()["id"] == rogue_id
    assert http.post("/api/v1/jobs", json=body).status_code == 201
    removed = http.delete("/api/v1/agents/real")
    assert removed.status_code == 200 and removed.json()["id"] == real
    assert http.delete("/api/v1/agents/real").status_code == 404

"""The Python client's sharing calls (priorities, the queue, teams and quotas, cordons and drains) against a
real coordinator served by uvicorn on a port it bound itself, over real HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mwms.client import Client, QueueEntry, Team
from mwms.errors import Conflict, Forbidden
from mwms.server.app import create_app
from mwms.server.db.engine import Database
from mwms.server.services.auth.tokens import Role, create_api_token
from mwms.v1 import agent_pb2_grpc
from mwms_testkit.coordinator_rows import place_task, register_request
from mwms_testkit.in_process_coordinator import coordinator_settings
from mwms_testkit.served_app import served as serving

JOIN_TOKEN = "join-token-for-client-sharing-tests-0123456"
ADMIN_TOKEN = "mwms_admin-token-for-client-sharing-tests-01"


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Database, str]]:
    """(API address, database, the id of its one agent)."""
    settings = coordinator_settings(
        tmp_path_factory.mktemp("coordinator"),
        join_token=JOIN_TOKEN,
        admin_token=ADMIN_TOKEN,
        agent_timeout_s=300,
    )
    application = create_app(settings)
    with serving(application, lifespan=True) as url:
        with grpc.insecure_channel(f"127.0.0.1:{application.state.grpc_port}") as channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            agent_id = stub.Register(register_request("node-1", JOIN_TOKEN), timeout=10).agent_id
        yield url, application.state.wiring.db, agent_id


def test_teams_quotas_and_priorities(coordinator: tuple[str, Database, str], program: Path) -> None:
    api, db, _ = coordinator
    with db.write() as session:
        _, secret = create_api_token(session, "dana", Role.USER)
    with Client(api, token=ADMIN_TOKEN) as admin, Client(api, token=secret) as dana:
        team = admin.add_team_member("nlp", "dana")
        assert (
            isinstance(team, Team) and team.name == "nlp" and team.members == ["dana"] and team.quota is None
        )
        assert admin.set_quota("nlp", gpus=4).quota == {"gpus": 4, "cpu_slots": None}
        assert [t.name for t in dana.teams()] == ["nlp"]
        with pytest.raises(Forbidden):
            dana.set_quota("nlp", gpus=400)

        # Pinned to an agent that never joins, so it waits (a job no agent could ever hold is refused).
        job = dana.submit(
            program, ["python", "train.py"], workers=1, agents=["not-joined-yet"], priority="low"
        )
        assert job.raw["team"] == "nlp" and job.raw["priority"] == 250
        assert dana.set_priority(job, 400).raw["priority"] == 400
        with pytest.raises(Forbidden):
            dana.set_priority(job.id, "high")
        waiting = dana.queue()
        assert all(isinstance(entry, QueueEntry) for entry in waiting)
        assert job.id in {entry.job_id for entry in waiting}
        pinned = next(entry for entry in waiting if entry.job_id == job.id)
        assert pinned.estimated_start is None and pinned.estimate_basis == "unknown"  # it waits for its agent

        assert admin.clear_quota("nlp").quota is None
        assert admin.remove_team_member("nlp", "dana").members == []


def test_cordon_drain_and_uncordon(coordinator: tuple[str, Database, str]) -> None:
    api, db, agent_id = coordinator
    job_id = place_task(db, agent_id, digest="d" * 64).job_id
    with Client(api, token=ADMIN_TOKEN) as admin:
        cordoned = admin.cordon("node-1", "swap the PSU")
        assert cordoned.cordoned and not cordoned.draining and cordoned.raw["cordon_reason"] == "swap the PSU"
        drained = admin.drain("node-1", "swap the PSU", grace_seconds=5)
        assert drained.draining and not drained.drained
        assert admin.job(job_id).state == "PREEMPTING"
        [shown] = admin.agents()
        assert shown.cordoned and shown.draining
        uncordoned = admin.uncordon(agent_id)
        assert not uncordoned.cordoned and not uncordoned.draining
        with pytest.raises(Conflict):
            admin.uncordon(agent_id)

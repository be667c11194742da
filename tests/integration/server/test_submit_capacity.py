"""A job no set of the registered agents can ever hold is refused at submit, saying what the cluster has
and what to change; offline and cordoned agents count, a cluster without agents refuses nothing, a pinned
job counts only its agents; agents online but not connected yet are waited for, not reported missing.
The rule on plain values, then through create_job and a scheduling pass on a real SQLite database."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from mwms.server.db.models import Agent, Bundle, Job, utcnow
from mwms.server.errors import Conflict
from mwms.server.schemas import JobCreate
from mwms.server.services.job_life.jobs import SubmitPolicy, create_job
from mwms.server.services.scheduler.scheduling import schedule_pending
from mwms.server.services.scheduler.submit_capacity import RegisteredAgent, impossible_reason
from mwms_testkit.cluster import wait_until
from mwms_testkit.coordinator_rows import register_request
from mwms_testkit.in_process_coordinator import InProcessCoordinator, coordinator_settings

CPU = [RegisteredAgent("id-a", "a", "cpu", 2), RegisteredAgent("id-b", "b", "cpu", 2)]
GPU = [RegisteredAgent("id-g", "g", "gpu", 2), *CPU]


def test_more_workers_than_the_registered_agents_hold() -> None:
    assert impossible_reason(CPU, 4, 0, None) is None
    assert impossible_reason(CPU, 5, 0, None) == (
        "needs 5 workers × 1 CPU slot, but the 2 registered agents with CPU slots (a 2, b 2) can hold at most "
        "4 such workers even when idle: lower --workers to at most 4, or start more agents (or give them "
        "more --slots)"
    )


def test_more_gpus_per_worker_than_any_agent_has() -> None:
    assert impossible_reason(GPU, 1, 2, None) is None
    assert impossible_reason(GPU, 1, 4, None) == (
        "each worker needs 4 GPUs but the largest registered agent (g) has 2: lower --gpus-per-worker to "
        "at most 2, or add a machine with 4 GPUs"
    )
    assert impossible_reason(CPU, 1, 1, None) == (
        "none of the 2 registered agents offers GPUs (they offer CPU slots): submit with --gpus-per-worker 0 "
        "to run on CPU slots, or start an agent on a GPU machine"
    )
    assert "offers CPU slots (they offer GPUs): ask for --gpus-per-worker N" in str(
        impossible_reason(GPU[:1], 1, 0, None)
    )


def test_no_registered_agent_refuses_nothing() -> None:
    assert impossible_reason([], 64, 8, None) is None


def test_a_pinned_job_counts_only_its_registered_agents() -> None:
    assert impossible_reason(CPU, 2, 0, ["a", "a"]) is None
    assert impossible_reason(CPU, 2, 0, ["a", "not-joined-yet"]) is None  # it waits for that one
    assert impossible_reason(CPU, 3, 0, ["a", "a", "a"]) == (
        "3 workers × 1 CPU slot are pinned to agent a, which has 2 CPU slots: pin fewer workers to it, or "
        "lower --gpus-per-worker"
    )
    assert "agent g, which the job is pinned to, offers GPUs, not CPU slots" in str(
        impossible_reason(GPU, 1, 0, ["g"])
    )


def _spec(**values: object) -> JobCreate:
    return JobCreate(**{"bundle_digest": "d" * 64, "command": ["python", "t.py"], "workers": 1, **values})


@pytest.mark.db_seed("d" * 64, agents=("a", "b"))
def test_submit_refuses_what_the_registered_agents_can_never_hold(db) -> None:
    policy = SubmitPolicy(refuse_impossible=True)
    with db.write() as session:
        # Offline (silent past its timeout) and cordoned agents still count: they can come back.
        for agent in session.query(Agent).all():
            agent.online_until = utcnow() - timedelta(minutes=5)
        session.query(Agent).filter(Agent.name == "b").one().cordoned_at = utcnow()
        assert create_job(session, _spec(workers=2), "alice", policy).state == "PENDING"
        with pytest.raises(Conflict) as refused:
            create_job(session, _spec(workers=3), "alice", policy)
        assert str(refused.value) == (
            "this job can never be placed: needs 3 workers × 1 CPU slot, but the 2 registered agents with CPU "
            "slots (a 1, b 1) can hold at most 2 such workers even when idle: lower --workers to at most 2, or "
            "start more agents (or give them more --slots)"
        )
        # Removed agents do not count; without a policy that asks (jobs stored by services), nothing is refused.
        session.query(Agent).filter(Agent.name == "b").one().removed_at = utcnow()
        with pytest.raises(Conflict):
            create_job(session, _spec(workers=2), "alice", policy)
        assert create_job(session, _spec(workers=3), "alice").state == "PENDING"


@pytest.mark.db_seed("e" * 64)
def test_submit_before_any_agent_joined_is_accepted(db) -> None:
    with db.write() as session:
        spec = JobCreate(bundle_digest="e" * 64, command=["python", "t.py"], workers=64, gpus_per_worker=8)
        assert create_job(session, spec, "alice", SubmitPolicy(refuse_impossible=True)).state == "PENDING"


@pytest.mark.db_seed("d" * 64, agents=("a", "b"))
def test_agents_online_but_not_connected_yet_are_waited_for_not_missing(db) -> None:
    """The race `make demo` hit: agents registered (online), their streams not open yet, a job submitted.
    The reason names them as connecting instead of "no online agent offers CPU slots"."""
    with db.write() as session:
        job = create_job(session, _spec(workers=2), "alice", SubmitPolicy(refuse_impossible=True))
        ids = {a.name: a.id for a in session.query(Agent).all()}
    with db.write() as session:
        schedule_pending(session, connected=frozenset())
    with db.read() as session:
        waiting = session.get(Job, job.id)
        assert waiting.state == "PENDING" and waiting.waiting["kind"] == "connecting"
        assert waiting.reason == (
            "needs 2 workers × 1 CPU slot: waiting for 2 agents that came online to connect (a, b); it "
            "starts once they have"
        )
    with db.write() as session:
        schedule_pending(session, connected=frozenset({ids["a"]}))
    with db.read() as session:
        assert session.get(Job, job.id).waiting["kind"] == "connecting"  # b still on its way
    with db.write() as session:
        schedule_pending(session, connected=frozenset(ids.values()))
    with db.read() as session:
        assert session.get(Job, job.id).state == "SCHEDULED"


JOIN_TOKEN = "join-token-for-submit-capacity-tests-0123456789"
ADMIN = {"Authorization": "Bearer mwms_admin-token-for-submit-capacity-tests-01"}


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[InProcessCoordinator]:
    """A real coordinator (REST in-process, its gRPC server and loops running) with a bundle stored."""
    settings = coordinator_settings(
        tmp_path / "coordinator",
        join_token=JOIN_TOKEN,
        admin_token=ADMIN["Authorization"].removeprefix("Bearer "),
        agent_timeout_s=300,
    )
    with ExitStack() as stack:
        served = InProcessCoordinator.start(stack, settings)
        with served.db.write() as session:
            session.add(Bundle(digest="d" * 64, size=1, archive_format="tar.gz"))
        yield served


def test_through_the_api_registered_agents_that_never_streamed(coordinator: InProcessCoordinator) -> None:
    """Agents registered (the API shows them online), their streams never opened: an impossible job is
    refused with a 409 that says what to change, a possible one waits for them to connect."""
    for name, port in (("box-a", 20000), ("box-b", 21000)):
        coordinator.stub.Register(register_request(name, JOIN_TOKEN, port_low=port), timeout=10)
    agents = coordinator.http.get("/api/v1/agents", headers=ADMIN).json()
    assert sorted(a["name"] for a in agents if a["online"]) == ["box-a", "box-b"]
    body = {"bundle_digest": "d" * 64, "command": ["python", "t.py"]}
    refused = coordinator.http.post("/api/v1/jobs", json={**body, "workers": 5}, headers=ADMIN)
    assert refused.status_code == 409, refused.text
    assert refused.json()["detail"] == (
        "this job can never be placed: needs 5 workers × 1 CPU slot, but the 2 registered agents with CPU "
        "slots (box-a 1, box-b 1) can hold at most 2 such workers even when idle: lower --workers to at most "
        "2, or start more agents (or give them more --slots)"
    )
    created = coordinator.http.post("/api/v1/jobs", json={**body, "workers": 2}, headers=ADMIN)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]

    def reason() -> dict[str, Any] | None:
        job = coordinator.http.get(f"/api/v1/jobs/{job_id}", headers=ADMIN).json()
        return job if job["waiting"].get("kind") else None

    job = wait_until(reason, 10, "a waiting reason from the scheduler loop")
    assert job["state"] == "PENDING" and job["waiting"]["kind"] == "connecting", job["waiting"]
    assert "no online agent" not in job["reason"]
    assert job["reason"].startswith("needs 2 workers × 1 CPU slot: waiting for 2 agents that came online")

"""Issue 18's REST surface for sharing a cluster: the queue, teams and quotas, priorities, and cordoning and
draining agents. A real coordinator (REST in-process, its gRPC server and loops running, SQLite); running jobs
are written straight into its database (testkit/mwms_testkit/coordinator_rows.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from mwms.server.db.models import Agent, Bundle, Job, Preemption, Task
from mwms.server.services.auth.tokens import Role
from mwms_testkit.coordinator_rows import place_task
from mwms_testkit.in_process_coordinator import InProcessCoordinator, coordinator_settings

JOIN_TOKEN = "join-token-for-sharing-api-tests-0123456789"
ADMIN_TOKEN = "mwms_admin-token-for-sharing-api-tests-0123"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
DIGEST = hashlib.sha256(b"sharing").hexdigest()


@dataclass
class Coordinator(InProcessCoordinator):
    """With two agents registered and a bundle stored, for the jobs the tests submit or place."""

    def __post_init__(self) -> None:
        with self.db.read() as session:  # a restarted coordinator has them already
            known = {name: agent_id for name, agent_id in session.execute(select(Agent.name, Agent.id))}
        self.agent_ids = [
            known.get(name) or self.register_agent(name, JOIN_TOKEN, port)
            for name, port in (("gpu-box-1", 20000), ("gpu-box-2", 21000))
        ]
        with self.db.write() as session:
            if session.get(Bundle, DIGEST) is None:
                session.add(Bundle(digest=DIGEST, size=1, archive_format="tar.gz"))

    def submit(self, headers: dict[str, str], **spec: Any) -> Any:
        body = {"name": "j", "bundle_digest": DIGEST, "command": ["python", "t.py"], "workers": 1, **spec}
        return self.http.post("/api/v1/jobs", json=body, headers=headers)

    def running_job(self, agent_id: str, options: dict[str, Any] | None = None, port: int = 20000) -> str:
        return place_task(self.db, agent_id, digest=DIGEST, options=options, port=port).job_id

    def agent(self, agent_id: str) -> dict[str, Any]:
        found = self.http.get("/api/v1/agents", headers=ADMIN).json()
        return next(a for a in found if a["id"] == agent_id)


def start(stack: ExitStack, data_dir: Path) -> Coordinator:
    settings = coordinator_settings(
        data_dir,
        join_token=JOIN_TOKEN,
        admin_token=ADMIN_TOKEN,
        agent_timeout_s=300,
        max_preemption_grace_s=600,
    )
    return Coordinator.start(stack, settings)


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    with ExitStack() as stack:
        yield start(stack, tmp_path / "coordinator")


ADMIN_WRITES = [
    ("PUT", "/api/v1/teams/ml/members/alice", None),
    ("DELETE", "/api/v1/teams/ml/members/alice", None),
    ("PUT", "/api/v1/teams/ml/quota", {"gpus": 4}),
    ("DELETE", "/api/v1/teams/ml/quota", None),
    ("POST", "/api/v1/agents/gpu-box-1/cordon", {"reason": "disk"}),
    ("POST", "/api/v1/agents/gpu-box-1/uncordon", None),
    ("POST", "/api/v1/agents/gpu-box-1/drain", {"reason": "disk"}),
]


def test_every_admin_write_is_refused_for_users_and_viewers(coordinator: Coordinator) -> None:
    user, viewer = coordinator.auth("alice"), coordinator.auth("vera", Role.VIEWER)
    for method, path, body in ADMIN_WRITES:
        for who, role in ((user, "user"), (viewer, "viewer")):
            refused = coordinator.http.request(method, path, json=body, headers=who)
            assert refused.status_code == 403, (method, path, role, refused.text)
            detail = refused.json()["detail"]
            assert f"the {role} role" in detail and "needs the" in detail, detail
    # Nothing happened.
    assert coordinator.http.get("/api/v1/teams", headers=user).json() == []
    assert coordinator.agent(coordinator.agent_ids[0])["cordoned"] is False


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("PUT", "/api/v1/teams/ml/quota", {"gpus": -1}, "gpus"),
        ("PUT", "/api/v1/teams/ml/quota", {"gpus": 1_000_001}, "gpus"),
        ("PUT", "/api/v1/teams/ml/quota", {"cpu_slots": "many"}, "cpu_slots"),
        ("PUT", "/api/v1/teams/ml/quota", {"gpus": 1, "tpus": 2}, "tpus"),
        ("POST", "/api/v1/agents/gpu-box-1/drain", {"grace_seconds": 3601}, "grace_seconds"),
        ("POST", "/api/v1/agents/gpu-box-1/drain", {"grace_seconds": -1}, "grace_seconds"),
        ("POST", "/api/v1/agents/gpu-box-1/drain", {"grace_seconds": 601}, "grace_seconds"),  # over the max
        ("POST", "/api/v1/agents/gpu-box-1/cordon", {"reason": "x" * 501}, "reason"),
        ("POST", "/api/v1/agents/gpu-box-1/cordon", {"reason": "two\nlines"}, "reason"),
        ("POST", "/api/v1/agents/gpu-box-1/drain", {"reason": "\x1b[2J"}, "reason"),
        ("PUT", f"/api/v1/teams/{'t' * 201}/members/alice", None, "team"),
    ],
)
def test_bad_bounds_are_422_naming_the_field(
    coordinator: Coordinator, method: str, path: str, body: Any, field: str
) -> None:
    refused = coordinator.http.request(method, path, json=body, headers=ADMIN)
    assert refused.status_code == 422, refused.text
    assert field in refused.json()["detail"], refused.json()
    assert coordinator.agent(coordinator.agent_ids[0])["cordoned"] is False


def test_unknown_agents_and_members_are_404(coordinator: Coordinator) -> None:
    assert coordinator.http.post("/api/v1/agents/nosuch/cordon", json={}, headers=ADMIN).status_code == 404
    missing = coordinator.http.delete("/api/v1/teams/ml/members/alice", headers=ADMIN)
    assert missing.status_code == 404 and "mwms team list" in missing.json()["detail"]
    assert coordinator.http.delete("/api/v1/teams/ml/quota", headers=ADMIN).status_code == 404


def test_priority_ceiling_holds_for_users_not_admins(coordinator: Coordinator) -> None:
    alice = coordinator.auth("alice")
    over = coordinator.submit(alice, priority=600)
    assert over.status_code == 403, over.text
    assert "MWMS_USER_PRIORITY_CEILING" in over.json()["detail"]
    named = coordinator.submit(alice, priority="low")
    assert named.status_code == 201, named.text
    assert named.json()["priority"] == 250
    assert coordinator.submit(alice, priority=1001).status_code == 422
    by_admin = coordinator.submit(ADMIN, priority="high")
    assert by_admin.status_code == 201 and by_admin.json()["priority"] == 750

    job_id = named.json()["id"]
    raised = coordinator.http.post(f"/api/v1/jobs/{job_id}/priority", json={"priority": 500}, headers=alice)
    assert raised.status_code == 200 and raised.json()["priority"] == 500
    too_high = coordinator.http.post(f"/api/v1/jobs/{job_id}/priority", json={"priority": 900}, headers=alice)
    assert too_high.status_code == 403, too_high.text
    by_admin = coordinator.http.post(f"/api/v1/jobs/{job_id}/priority", json={"priority": 900}, headers=ADMIN)
    assert by_admin.status_code == 200 and by_admin.json()["priority"] == 900


def test_set_priority_of_a_job_that_is_not_waiting_is_409(coordinator: Coordinator) -> None:
    job_id = coordinator.running_job(coordinator.agent_ids[0])
    refused = coordinator.http.post(f"/api/v1/jobs/{job_id}/priority", json={"priority": 100}, headers=ADMIN)
    assert refused.status_code == 409, refused.text
    assert "RUNNING" in refused.json()["detail"]


def test_team_membership_decides_a_new_jobs_team(coordinator: Coordinator) -> None:
    alice, bob = coordinator.auth("alice"), coordinator.auth("bob")
    added = coordinator.http.put("/api/v1/teams/ml/members/alice", headers=ADMIN)
    assert added.status_code == 200, added.text
    assert added.json() == {
        "team": "ml",
        "members": ["alice"],
        "quota": None,
        "in_use": {"gpus": 0, "cpu_slots": 0},
        # Nobody runs or waits: were it to submit, its share would be both agents' slots.
        "usage_device_hours": {"gpus": 0.0, "cpu_slots": 0.0},
        "share": {"gpus": 0.0, "cpu_slots": 2.0},
        "standing": 0.0,
    }
    assert coordinator.submit(alice).json()["team"] == "ml"
    assert coordinator.submit(bob).json()["team"] == "bob"  # a team of one

    quota = coordinator.http.put("/api/v1/teams/ml/quota", json={"gpus": 8}, headers=ADMIN)
    assert quota.status_code == 200 and quota.json()["quota"] == {"gpus": 8, "cpu_slots": None}
    teams = {team["team"]: team for team in coordinator.http.get("/api/v1/teams", headers=bob).json()}
    assert teams["ml"]["members"] == ["alice"] and teams["ml"]["quota"] == {"gpus": 8, "cpu_slots": None}

    removed = coordinator.http.delete("/api/v1/teams/ml/members/alice", headers=ADMIN)
    assert removed.status_code == 200 and removed.json()["members"] == []
    assert coordinator.submit(alice).json()["team"] == "alice"
    cleared = coordinator.http.delete("/api/v1/teams/ml/quota", headers=ADMIN)
    assert cleared.status_code == 200 and cleared.json()["quota"] is None


def test_teams_show_the_devices_their_running_jobs_hold(coordinator: Coordinator) -> None:
    job_id = coordinator.running_job(coordinator.agent_ids[0])
    with coordinator.db.write() as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.team = "vision"
    teams = {team["team"]: team for team in coordinator.http.get("/api/v1/teams", headers=ADMIN).json()}
    assert teams["vision"]["in_use"] == {"gpus": 0, "cpu_slots": 1}
    assert teams["vision"]["members"] == [] and teams["vision"]["quota"] is None


def test_cordon_is_stored_shown_and_survives_a_new_app(tmp_path: Path) -> None:
    data_dir = tmp_path / "coordinator"
    with ExitStack() as stack:
        coordinator = start(stack, data_dir)
        agent_id = coordinator.agent_ids[0]
        cordoned = coordinator.http.post(
            "/api/v1/agents/gpu-box-1/cordon", json={"reason": "  ECC errors on GPU 3 "}, headers=ADMIN
        )
        assert cordoned.status_code == 200, cordoned.text
        body = cordoned.json()
        assert body["id"] == agent_id and body["cordoned"] is True and body["draining"] is False
        assert body["cordoned_by"] == "admin" and body["cordon_reason"] == "ECC errors on GPU 3"
        assert body["cordoned_at"] is not None
        first_at = body["cordoned_at"]
        # Cordoning again records the new why and keeps when it began.
        again = coordinator.http.post(
            f"/api/v1/agents/{agent_id}/cordon", json={"reason": "RMA"}, headers=ADMIN
        )
        assert again.json()["cordon_reason"] == "RMA" and again.json()["cordoned_at"] == first_at
        other = coordinator.agent(coordinator.agent_ids[1])
        assert other["cordoned"] is False and other["cordoned_at"] is None and other["cordon_reason"] == ""

    with ExitStack() as stack:
        restarted = start(stack, data_dir)
        shown = restarted.agent(agent_id)
        assert shown["cordoned"] is True and shown["cordoned_by"] == "admin"
        assert shown["cordon_reason"] == "RMA" and shown["cordoned_at"] == first_at
        back = restarted.http.post("/api/v1/agents/gpu-box-1/uncordon", headers=ADMIN)
        assert back.status_code == 200, back.text
        assert back.json()["cordoned"] is False and back.json()["cordoned_at"] is None
        assert back.json()["cordoned_by"] == "" and back.json()["cordon_reason"] == ""
        twice = restarted.http.post("/api/v1/agents/gpu-box-1/uncordon", headers=ADMIN)
        assert twice.status_code == 409 and "not cordoned" in twice.json()["detail"]


def test_drain_preempts_the_running_job_with_the_grace(coordinator: Coordinator) -> None:
    agent_id = coordinator.agent_ids[0]
    job_id = coordinator.running_job(agent_id)
    drained = coordinator.http.post(
        "/api/v1/agents/gpu-box-1/drain", json={"reason": "kernel update", "grace_seconds": 7}, headers=ADMIN
    )
    assert drained.status_code == 200, drained.text
    body = drained.json()
    assert body["cordoned"] is True and body["draining"] is True and body["cordoned_by"] == "admin"
    assert body["drained"] is False  # its task has not exited yet
    with coordinator.db.read() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.state == "PREEMPTING", job.state if job else None
        tasks = session.scalars(select(Task).where(Task.job_id == job_id)).all()
        assert [(t.stop_requested, t.stop_grace_s) for t in tasks] == [(True, 7)]
        assert "agent gpu-box-1 is drained by admin: kernel update" in tasks[0].stop_reason
        [record] = session.scalars(select(Preemption).where(Preemption.victim_job_id == job_id)).all()
        assert record.cause == "drain" and record.preemptor_job_id is None
    shown = coordinator.agent(agent_id)
    assert shown["draining"] is True and shown["cordon_reason"] == "kernel update"
    assert coordinator.http.get(f"/api/v1/jobs/{job_id}", headers=ADMIN).json()["state"] == "PREEMPTING"

    back = coordinator.http.post(f"/api/v1/agents/{agent_id}/uncordon", headers=ADMIN)
    assert back.json()["cordoned"] is False and back.json()["draining"] is False


def test_drain_grace_defaults_to_the_jobs_own(coordinator: Coordinator) -> None:
    job_id = coordinator.running_job(coordinator.agent_ids[0], options={"preemption_grace_seconds": 12})
    assert coordinator.http.post("/api/v1/agents/gpu-box-1/drain", json={}, headers=ADMIN).status_code == 200
    with coordinator.db.read() as session:
        [task] = session.scalars(select(Task).where(Task.job_id == job_id)).all()
        assert task.stop_requested and task.stop_grace_s == 12


def test_drain_with_let_finish_preempts_nothing_and_an_idle_agent_is_drained(
    coordinator: Coordinator,
) -> None:
    job_id = coordinator.running_job(coordinator.agent_ids[0])
    kept = coordinator.http.post("/api/v1/agents/gpu-box-1/drain", json={"let_finish": True}, headers=ADMIN)
    assert kept.status_code == 200 and kept.json()["draining"] is True and kept.json()["drained"] is False
    with coordinator.db.read() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.state == "RUNNING"
        assert not any(t.stop_requested for t in session.scalars(select(Task).where(Task.job_id == job_id)))
    idle = coordinator.http.post("/api/v1/agents/gpu-box-2/drain", json={"reason": "spare"}, headers=ADMIN)
    assert idle.status_code == 200 and idle.json()["drained"] is True


def test_the_queue_lists_waiting_jobs(coordinator: Coordinator) -> None:
    alice = coordinator.auth("alice")
    # Pinned to an agent that never joins: they wait (64 workers would be refused at submit).
    waiting = {coordinator.submit(alice, agents=["not-joined-yet"]).json()["id"] for _ in range(3)}
    coordinator.running_job(coordinator.agent_ids[0])
    page = coordinator.http.get("/api/v1/queue", headers=alice)
    assert page.status_code == 200, page.text
    body = page.json()
    assert set(body) == {"jobs", "total", "offset", "limit"} and body["offset"] == 0
    assert {entry["job_id"] for entry in body["jobs"]} >= waiting and body["total"] >= 3
    fields = {"position", "job_id", "name", "state", "team", "submitted_by", "priority", "workers"}
    fields |= {"gpus_per_worker", "memory_per_worker", "preemptible", "created_at", "waiting"}
    fields |= {"estimated_start", "estimate_basis"}
    for entry in body["jobs"]:
        assert set(entry) == fields, entry
    assert sorted(entry["position"] for entry in body["jobs"]) == list(range(1, len(body["jobs"]) + 1))
    second = coordinator.http.get("/api/v1/queue", params={"offset": 1, "limit": 1}, headers=alice).json()
    assert len(second["jobs"]) == 1 and second["jobs"][0]["position"] == 2
    assert coordinator.http.get("/api/v1/queue", params={"limit": 0}, headers=alice).status_code == 422

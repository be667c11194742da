"""Issue 16 item 9a: a stack dump on request (it pauses the job's tasks) is owner-checked like cancel, by the
one check in server/services/auth/job_owners.py: the submitter or an admin. A real coordinator (REST in-process,
its gRPC server and loops running, SQLite); the job's rows are written straight into its database.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import func, select

from mwms.server.db.models import Job, StackRequest
from mwms.server.services.auth.tokens import Role
from mwms_testkit.coordinator_rows import place_task
from mwms_testkit.in_process_coordinator import InProcessCoordinator, coordinator_settings

JOIN_TOKEN = "join-token-for-owner-check-tests-0123456789"
ADMIN_TOKEN = "mwms_admin-token-for-owner-check-tests-0123"


@dataclass
class Coordinator(InProcessCoordinator):
    """With one agent registered, for the jobs it places."""

    def __post_init__(self) -> None:
        self.agent_id = self.register_agent("owner-agent", JOIN_TOKEN)

    def running_job_of(self, user: str) -> str:
        task = place_task(self.db, self.agent_id, digest=hashlib.sha256(b"owners").hexdigest(), port=20000)
        with self.db.write() as session:
            job = session.get(Job, task.job_id)
            assert job is not None
            job.submitted_by = user
        return task.job_id

    def stack_requests(self, job_id: str) -> int:
        with self.db.read() as session:
            return session.scalar(select(func.count()).where(StackRequest.job_id == job_id)) or 0


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    settings = coordinator_settings(
        tmp_path / "coordinator", join_token=JOIN_TOKEN, admin_token=ADMIN_TOKEN, agent_timeout_s=300
    )
    with ExitStack() as stack:
        yield Coordinator.start(stack, settings)


def test_stack_dumps_are_for_the_jobs_submitter_and_admins_only(coordinator: Coordinator) -> None:
    alice, bob = coordinator.auth("alice"), coordinator.auth("bob")
    admin, viewer = {"Authorization": f"Bearer {ADMIN_TOKEN}"}, coordinator.auth("vera", Role.VIEWER)
    job_id = coordinator.running_job_of("alice")

    for who in (bob, viewer):
        refused = coordinator.http.post(f"/api/v1/jobs/{job_id}/stacks", headers=who)
        assert refused.status_code == 403, refused.text
    refused = coordinator.http.post(f"/api/v1/jobs/{job_id}/stacks", headers=bob)
    assert refused.json()["detail"] == (
        f"job {job_id} was submitted by 'alice'; only that user or an admin may dump its stacks "
        "(which pauses its tasks)"
    )
    assert coordinator.stack_requests(job_id) == 0  # nothing was asked of the agents

    # The agent has no stream here: the dump answers at once, marking its task unreachable.
    own = coordinator.http.post(f"/api/v1/jobs/{job_id}/stacks", headers=alice)
    assert own.status_code == 200, own.text
    assert own.json()["requested_by"] == "alice"
    by_admin = coordinator.http.post(
        f"/api/v1/jobs/{coordinator.running_job_of('alice')}/stacks", headers=admin
    )
    assert by_admin.status_code == 200 and by_admin.json()["requested_by"] == "admin"
    # Reading the stored dumps stays open to every role, as reading the job does.
    assert coordinator.http.get(f"/api/v1/jobs/{job_id}/stacks", headers=bob).status_code == 200


def test_cancel_goes_through_the_same_check(coordinator: Coordinator) -> None:
    alice, bob = coordinator.auth("alice"), coordinator.auth("bob")
    job_id = coordinator.running_job_of("alice")
    refused = coordinator.http.post(f"/api/v1/jobs/{job_id}/cancel", headers=bob)
    assert refused.status_code == 403
    assert refused.json()["detail"] == (
        f"job {job_id} was submitted by 'alice'; only that user or an admin may cancel it"
    )
    assert (
        coordinator.http.post(f"/api/v1/jobs/{job_id}/cancel", headers=alice).json()["state"] == "CANCELLED"
    )

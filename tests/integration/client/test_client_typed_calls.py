"""The Python client's typed calls behind the CLI (pages of jobs, the queue and logs, metrics, artifacts,
preflight results, stack dumps, cancels, uploads, identity, tokens, removing agents) against the fake API
over real HTTP: each answers a typed object that keeps the API's JSON as `raw`."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from mwms.client import (
    Agent,
    Client,
    Identity,
    JobPage,
    LogPage,
    Preflight,
    QueuePage,
    StackDump,
    Token,
)
from mwms.client.packing import pack_directory
from mwms.errors import Conflict, NotFound
from mwms_testkit.fake_api import ADMIN_TOKEN, FakeState


def stack_dump(job_id: str) -> dict:
    at = datetime.now(timezone.utc).isoformat()
    task = {
        "task_index": 0,
        "task_id": f"{job_id}-0",
        "agent_id": "a1",
        "agent_name": "local-1",
        "pid": 123,
        "method": "py-spy",
        "answered": True,
        "error": "",
        "in_collective": True,
        "received_at": at,
        "text": "",
        "threads": [{"title": "Thread 1", "in_collective": True, "frames": ["train (train.py:1)"]}],
    }
    return {
        "id": "dump1",
        "job_id": job_id,
        "attempt": 1,
        "cause": "request",
        "requested_by": "bob",
        "requested_at": at,
        "complete": True,
        "tasks": [task],
    }


def test_pages_logs_metrics_artifacts_and_diagnostics(
    fake_api: tuple[str, FakeState], user_token: str, program: Path
) -> None:
    api, state = fake_api
    with Client(api, token=user_token) as client:
        job = client.submit(program, ["python", "train.py"], workers=2)
        queued = client.queue_page(limit=1)
        assert isinstance(queued, QueuePage) and queued.total == 1 and queued.raw["total"] == 1
        assert [entry.job_id for entry in queued.entries] == [job.id]
        assert job.wait(poll_interval=0.05) == "SUCCEEDED"

        page = client.job_page(["succeeded"], limit=1)
        assert isinstance(page, JobPage) and page.total == 1 and page.limit == 1
        assert [listed.id for listed in page.jobs] == [job.id] and page.raw["jobs"][0]["id"] == job.id
        assert client.job_page(["FAILED"]).jobs == [] and client.job_page(["FAILED"]).total == 0

        logs = client.log_page(job, task=0)
        assert isinstance(logs, LogPage) and logs.raw["lines"][0]["text"] == "epoch 1 starting"
        assert [line.text for line in logs.lines][-1] == "done"
        assert logs.next_after == logs.lines[-1].id
        assert client.log_page(job.id, task=0, after=logs.next_after).lines == []
        assert [line.text for line in client.log_page(job.id, task=0, tail=1).lines] == ["done"]

        assert [(p.step, p.value) for p in client.metrics(job.id, "loss", min_step=15)] == [(20, 0.25)]
        assert client.metrics(job.id, max_step=10).names() == ["accuracy", "loss"]
        assert client.metrics(job.id, "loss") == job.metrics("loss")

        state.artifacts[job.id] = {"model.keras": b"weights"}
        [artifact] = client.artifacts(job.id)
        assert artifact.path == "model.keras" and artifact.size == 7 and artifact.raw["size"] == 7

        preflight = client.preflight(job)
        assert isinstance(preflight, Preflight) and preflight.job_id == job.id
        assert preflight.attempts == [] and preflight.latest_results == []

        with pytest.raises(NotFound):
            client.stacks(job.id)
        state.stack_dumps[job.id] = stack_dump(job.id)
        for dump in (client.take_stacks(job.id), client.stacks(job)):
            assert isinstance(dump, StackDump) and dump.id == "dump1" and dump.job_id == job.id
            assert dump.cause == "request" and dump.complete and dump.requested_at is not None
            assert dump.tasks[0]["threads"][0]["frames"] == ["train (train.py:1)"]


def test_cancel_and_upload(fake_api: tuple[str, FakeState], user_token: str, program: Path) -> None:
    api, state = fake_api
    with Client(api, token=user_token) as client:
        job = client.submit(program, ["python", "train.py"], workers=1)
        cancelled = client.cancel(job.id)
        assert (
            cancelled.id == job.id
            and cancelled.state == "CANCELLED"
            and cancelled.raw["state"] == "CANCELLED"
        )
        with pytest.raises(Conflict):
            client.cancel(job)
        bundle = pack_directory(program)
        seen: list[int] = []
        try:
            digest = client.upload_bundle(bundle.file, on_bytes=seen.append)
        finally:
            bundle.close()
        assert digest in state.bundles and sum(seen) == bundle.size


def test_identity_tokens_and_removing_an_agent(fake_api: tuple[str, FakeState]) -> None:
    api, state = fake_api
    with Client(api, token=ADMIN_TOKEN) as admin:
        identity = admin.identity()
        assert isinstance(identity, Identity) and (identity.user, identity.role) == ("alice", "admin")
        assert admin.whoami() == identity.raw and identity.token_name == "alice's token"

        created = admin.create_token("dave", "viewer", "laptop", expires_in_seconds=3600)
        assert isinstance(created, Token) and created.secret and created.raw["token"] == created.secret
        assert (created.user, created.role, created.name) == ("dave", "viewer", "laptop")
        assert created.expires_at is not None and not created.revoked
        [listed] = [token for token in admin.tokens() if token.id == created.id]
        assert listed.secret is None and "token" not in listed.raw
        revoked = admin.revoke_token(created.id)
        assert revoked.id == created.id and revoked.revoked

        joining = admin.create_join_token("rack-2")
        assert joining.secret and joining.name == "rack-2" and joining.expires_at is None
        assert joining.id in {token.id for token in admin.join_tokens()}
        assert admin.revoke_join_token(joining.id).revoked

        removed = admin.remove_agent("a1")
        assert isinstance(removed, Agent) and removed.name == "local-1" and not removed.online
        assert state.removed_agents == ["a1"] and admin.agents() == []

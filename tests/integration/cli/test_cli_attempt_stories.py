"""`mwms status` tells each attempt's story, against a real coordinator (the app with its lifespan, gRPC,
scheduler and reconciler loops, served by uvicorn on a port it bound itself) over real HTTP: a task killed
by a signal (restarted), a drain by an admin through `mwms agent drain`, a cancel through `mwms cancel`.
The agents are registered over gRPC without a stream: the test runs the scheduler's passes and applies their
task reports through the coordinator's own services."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from typer.testing import CliRunner

from mwms.cli import connect
from mwms.cli.main import app
from mwms.server.app import create_app
from mwms.server.db.engine import Database
from mwms.server.db.models import Agent, Bundle, Job
from mwms.server.schemas import JobCreate
from mwms.server.services.job_life.jobs import create_job
from mwms.server.services.job_life.tasks import TaskReport, apply_report
from mwms.server.services.scheduler.scheduling import schedule_pending
from mwms.server.states import TaskState
from mwms.v1 import agent_pb2_grpc
from mwms_testkit.cluster import wait_until
from mwms_testkit.coordinator_rows import register_request
from mwms_testkit.in_process_coordinator import coordinator_settings
from mwms_testkit.served_app import served as serving

JOIN_TOKEN = "join-token-for-cli-attempt-stories-0123456"
ADMIN_TOKEN = "mwms_admin-token-for-cli-attempt-stories-01"
DIGEST = "a" * 64

runner = CliRunner()


@dataclass
class Served:
    api: str
    db: Database

    def attempt(self, job_id: str, number: int) -> tuple[str, str]:
        """Runs scheduler passes until the job's attempt `number` is placed; its (state, agent name). The
        coordinator's own loop offers only agents with a live stream, which these have not."""

        def placed() -> tuple[str, str] | None:
            with self.db.write() as session:
                schedule_pending(session)
                job = session.get(Job, job_id)
                if job is None or len(job.attempts) < number:
                    return None
                agent = session.get(Agent, job.attempts[number - 1].tasks[0].agent_id)
                return job.state, agent.name if agent else ""

        return wait_until(placed, 30, f"attempt {number} of job {job_id} to be placed", interval=0.05)

    def report(self, job_id: str, state: TaskState, exit_code: int | None = None) -> None:
        """The newest attempt's task reports `state`, as its agent would."""
        with self.db.write() as session:
            job = session.get(Job, job_id)
            assert job is not None
            task = job.attempts[-1].tasks[0]
            agent = session.get(Agent, task.agent_id)
            apply_report(session, agent, TaskReport(task.id, state, exit_code), backoff_base_s=0)


@pytest.fixture
def served(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    """A coordinator with two registered one-slot agents; commands send the admin token to it."""
    settings = coordinator_settings(
        tmp_path_factory.mktemp("coordinator"),
        join_token=JOIN_TOKEN,
        admin_token=ADMIN_TOKEN,
        agent_timeout_s=300,
        restart_backoff_s=0,
    )
    application = create_app(settings)
    with serving(application, lifespan=True) as url:
        with grpc.insecure_channel(f"127.0.0.1:{application.state.grpc_port}") as channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            for name, port in (("box-a", 20000), ("box-b", 21000)):
                stub.Register(register_request(name, JOIN_TOKEN, port_low=port), timeout=10)
        monkeypatch.setenv("MWMS_API", url)
        monkeypatch.setenv("MWMS_TOKEN", ADMIN_TOKEN)
        monkeypatch.setattr(connect, "RETRY_SECONDS", 1.0)
        yield Served(url, application.state.wiring.db)


def test_status_prints_one_line_per_attempt_and_json_gives_the_apis_shape(served: Served) -> None:
    with served.db.write() as session:
        session.add(Bundle(digest=DIGEST, size=1, archive_format="tar.gz"))
        session.flush()
        spec = JobCreate(bundle_digest=DIGEST, command=["python", "train.py"], workers=1)
        job_id = create_job(session, spec, submitted_by="admin").id

    served.attempt(job_id, 1)
    served.report(job_id, TaskState.RUNNING)
    served.report(job_id, TaskState.FAILED, 137)  # restarted at once (no backoff)
    _, first_agent = served.attempt(job_id, 1)

    _, second_agent = served.attempt(job_id, 2)
    served.report(job_id, TaskState.RUNNING)
    drained = runner.invoke(app, ["agent", "drain", second_agent, "--reason", "reboot", "--grace", "5s"])
    assert drained.exit_code == 0, drained.output
    served.report(job_id, TaskState.STOPPED, -15)

    _, third_agent = served.attempt(job_id, 3)
    assert third_agent != second_agent  # the drained agent is cordoned
    cancelled = runner.invoke(app, ["cancel", job_id])
    assert cancelled.exit_code == 0, cancelled.output

    status = runner.invoke(app, ["status", job_id])
    assert status.exit_code == 0, status.output
    stories = status.stdout.split("\nAttempts\n", 1)[1].splitlines()
    expected = [
        rf"attempt 1: task 0 failed on agent {first_agent}: exit code 137 \(SIGKILL\); restart 1 of 3 after \d+s",
        rf"attempt 2: drained from agent {second_agent} by admin \(reboot\) after \d+s",
        r"attempt 3: cancelled by admin after \d+s",
    ]
    assert len(stories) == 3, status.stdout
    for line, pattern in zip(stories, expected, strict=True):
        assert re.fullmatch(r"\s*" + pattern, line), (line, pattern)

    as_json = runner.invoke(app, ["status", job_id, "--json"])
    assert as_json.exit_code == 0, as_json.output
    history = json.loads(as_json.stdout)["attempt_history"]
    assert [a["ended"]["kind"] for a in history] == ["task_failed", "drained", "cancelled"]
    assert (history[0]["ended"]["exit_code"], history[0]["ended"]["restart_cause"]) == (137, "signal")
    assert (history[1]["ended"]["agent"], history[1]["ended"]["by"]) == (second_agent, "admin")
    assert history[2]["ended"]["by"] == "admin"
    assert [e["cause"] for e in history[1]["events"]] == ["", "drained"]

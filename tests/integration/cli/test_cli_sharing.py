"""Issue 18's commands (`mwms priority`, `queue`, `team`, `quota`, `agent cordon|uncordon|drain`, and the
sharing options of `submit`) against a real coordinator: the app with its lifespan, gRPC and loops, served
by uvicorn on a port it bound itself, over real HTTP. Running jobs are written straight into its database."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import select, update
from typer.testing import CliRunner

from mwms.cli import connect, sharing_commands
from mwms.cli.main import app
from mwms.server.app import create_app
from mwms.server.db.engine import Database
from mwms.server.db.models import Job, Task, TeamUsage, utcnow
from mwms.server.schemas import JobCreate
from mwms.server.services.auth.tokens import Role, create_api_token
from mwms.server.services.job_life.jobs import cancel_job, create_job
from mwms.v1 import agent_pb2_grpc
from mwms_testkit.cluster import wait_until
from mwms_testkit.coordinator_rows import place_task, register_request
from mwms_testkit.in_process_coordinator import coordinator_settings
from mwms_testkit.served_app import served as serving

JOIN_TOKEN = "join-token-for-cli-sharing-tests-0123456789"
ADMIN_TOKEN = "mwms_admin-token-for-cli-sharing-tests-0123"
DIGEST = "c" * 64

runner = CliRunner()


@dataclass
class Served:
    api: str
    db: Database
    agent_ids: list[str]

    def token(self, user: str, role: Role = Role.USER) -> str:
        with self.db.write() as session:
            _, secret = create_api_token(session, user, role)
        return secret

    def running_job(self, agent_id: str) -> str:
        return place_task(self.db, agent_id, digest=DIGEST).job_id

    def job(self, job_id: str) -> Job:
        with self.db.read() as session:
            job = session.get(Job, job_id)
            assert job is not None
            return job


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One coordinator for the module, with two registered agents."""
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
            agent_ids = [
                stub.Register(register_request(name, JOIN_TOKEN, port_low=port), timeout=10).agent_id
                for name, port in (("box-a", 20000), ("box-b", 21000))
            ]
        yield Served(url, application.state.wiring.db, agent_ids)


@pytest.fixture
def admin(served: Served, monkeypatch: pytest.MonkeyPatch) -> Served:
    """Commands send the admin token (MWMS_TOKEN) to the coordinator (MWMS_API)."""
    monkeypatch.setenv("MWMS_API", served.api)
    monkeypatch.setenv("MWMS_TOKEN", ADMIN_TOKEN)
    monkeypatch.setattr(connect, "RETRY_SECONDS", 1.0)
    monkeypatch.setattr(sharing_commands, "DRAIN_POLL_S", 0.05)
    return served


def mwms(*argv: str) -> Any:
    """Runs `mwms ARGV --json`, asserts it exited 0, and returns the parsed stdout."""
    result = runner.invoke(app, [*argv, "--json"])
    assert result.exit_code == 0, (argv, result.output)
    return json.loads(result.stdout)


@pytest.fixture
def program(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def test_team_and_quota_commands(admin: Served) -> None:
    added = mwms("team", "add", "ml", "alice")
    assert added["team"] == "ml" and added["members"] == ["alice"] and added["quota"] is None
    mwms("team", "add", "ml", "bob")
    quota = mwms("quota", "set", "ml", "--gpus", "8")
    assert quota["quota"] == {"gpus": 8, "cpu_slots": None}
    teams = {team["team"]: team for team in mwms("team", "list")}
    assert teams["ml"]["members"] == ["alice", "bob"] and teams["ml"]["quota"]["gpus"] == 8

    table = runner.invoke(app, ["team", "list"])
    assert table.exit_code == 0 and "alice, bob" in table.stdout and "8 GPU, any CPU" in table.stdout
    line = runner.invoke(app, ["quota", "set", "ml", "--gpus", "2", "--cpu-slots", "16"])
    assert line.exit_code == 0 and "quota 2 GPU, 16 CPU" in line.stdout

    assert mwms("team", "remove", "ml", "bob")["members"] == ["alice"]
    assert mwms("quota", "clear", "ml")["quota"] is None
    nothing = runner.invoke(app, ["quota", "set", "ml"])
    assert nothing.exit_code == 2 and "--gpus" in nothing.stderr
    missing = runner.invoke(app, ["team", "remove", "ml", "nobody"])
    assert missing.exit_code == 4 and "not in team" in missing.stderr


def test_users_may_read_teams_but_not_change_them(admin: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MWMS_TOKEN", admin.token("carol"))
    for argv in (["team", "add", "ml", "carol"], ["quota", "clear", "ml"], ["agent", "cordon", "box-a"]):
        refused = runner.invoke(app, argv)
        assert refused.exit_code == 5, (argv, refused.output)
        assert "not allowed" in refused.stderr and "admin role" in refused.stderr
    assert runner.invoke(app, ["team", "list"]).exit_code == 0


def test_cordon_and_uncordon_show_in_agents(admin: Served) -> None:
    cordoned = mwms("agent", "cordon", "box-a", "--reason", "fan failure")
    assert cordoned["cordoned"] is True and cordoned["cordoned_by"] == "admin"
    assert cordoned["cordon_reason"] == "fan failure" and cordoned["cordoned_at"]
    table = runner.invoke(app, ["agents"])
    assert table.exit_code == 0 and "CORDON" in table.stdout
    assert "cordoned by admin: fan failure" in table.stdout
    line = runner.invoke(app, ["agent", "uncordon", "box-a"])
    assert line.exit_code == 0 and "agent box-a: schedulable" in line.stdout
    again = runner.invoke(app, ["agent", "uncordon", "box-a"])
    assert again.exit_code == 2 and "not cordoned" in again.stderr
    unknown = runner.invoke(app, ["agent", "cordon", "no-such-box"])
    assert unknown.exit_code == 4


def test_drain_preempts_and_wait_ends_when_the_agent_is_empty(admin: Served) -> None:
    job_id = admin.running_job(admin.agent_ids[1])
    timed_out = runner.invoke(
        app, ["agent", "drain", "box-b", "--reason", "reboot", "--grace", "9s", "--wait", "--timeout", "0.3s"]
    )
    assert timed_out.exit_code == 1, timed_out.output
    assert "still runs" in timed_out.stderr and "waiting for j[0] to stop" in timed_out.stderr
    assert admin.job(job_id).state == "PREEMPTING"
    assert mwms("jobs", "--state", "PREEMPTING")["jobs"][0]["id"] == job_id
    with admin.db.read() as session:
        [task] = session.scalars(select(Task).where(Task.job_id == job_id)).all()
        assert task.stop_requested and task.stop_grace_s == 9

    def agent_reports_the_exit() -> None:
        threading.Event().wait(0.3)
        with admin.db.write() as session:
            [task] = session.scalars(select(Task).where(Task.job_id == job_id)).all()
            task.state, task.exit_code, task.ended_at = "STOPPED", -15, utcnow()

    reporter = threading.Thread(target=agent_reports_the_exit)
    reporter.start()
    try:
        drained = runner.invoke(app, ["agent", "drain", "box-b", "--wait", "--timeout", "30s", "--json"])
    finally:
        reporter.join()
    assert drained.exit_code == 0, drained.output
    body = json.loads(drained.stdout)
    assert body["draining"] is True and body["drained"] is True and body["tasks"] == []
    assert body["cordon_reason"] == ""  # the second drain gave no reason
    line = runner.invoke(app, ["agent", "uncordon", "box-b"])
    assert line.exit_code == 0, line.output


def test_drain_let_finish_keeps_the_job_running(admin: Served) -> None:
    job_id = admin.running_job(admin.agent_ids[0])
    drained = mwms("agent", "drain", "box-a", "--let-finish", "--reason", "retire")
    assert drained["draining"] is True and drained["drained"] is False
    assert admin.job(job_id).state == "RUNNING"
    table = runner.invoke(app, ["agents"])
    assert "draining by admin: retire" in table.stdout
    mwms("agent", "uncordon", "box-a")


def test_submit_with_priority_and_preemption_options_then_change_it(admin: Served, program: Path) -> None:
    # Pinned to an agent that never joins, so it waits (a job no agent could ever hold is refused).
    argv = [
        "submit",
        str(program),
        "-n",
        "1",
        "--agents",
        "not-joined-yet",
        "--priority",
        "high",
        "--no-preemptible",
    ]
    argv += ["--preemption-grace", "20s", "--json", "--", "python", "train.py"]
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    job = json.loads(result.stdout)
    assert job["priority"] == 750 and job["preemptible"] is False and job["preemption_grace_seconds"] == 20
    assert job["team"] == "admin"

    assert mwms("priority", job["id"], "low")["priority"] == 250
    assert mwms("priority", job["id"], "900")["priority"] == 900
    bad = runner.invoke(app, ["priority", job["id"], "urgent"])
    assert bad.exit_code == 2 and "low (250)" in bad.stderr
    too_high = runner.invoke(app, ["priority", job["id"], "1001"])
    assert too_high.exit_code == 2

    shown = runner.invoke(app, ["status", job["id"]])
    assert shown.exit_code == 0
    assert "priority:     900, not preemptible, 20 s grace when preempted" in shown.stdout
    assert "team:" in shown.stdout
    listed = runner.invoke(app, ["jobs"])
    assert "PRIO" in listed.stdout and "TEAM" in listed.stdout
    bad_submit = runner.invoke(
        app, ["submit", str(program), "-n", "1", "--priority", "x", "--", "python", "t.py"]
    )
    assert bad_submit.exit_code == 2 and "--priority" in bad_submit.stderr


def test_queue_lists_waiting_jobs(admin: Served, program: Path) -> None:
    argv = ["submit", str(program), "-n", "2", "--agents", "not-joined-yet,box-a", "--json"]
    result = runner.invoke(app, [*argv, "--", "python", "train.py"])
    assert result.exit_code == 0, result.output
    job_id = json.loads(result.stdout)["id"]
    page = mwms("queue")
    assert set(page) == {"jobs", "total", "offset", "limit"}
    assert job_id in {entry["job_id"] for entry in page["jobs"]}
    entry = next(entry for entry in page["jobs"] if entry["job_id"] == job_id)
    assert entry["workers"] == 2 and entry["submitted_by"] == "admin" and "waiting" in entry
    table = runner.invoke(app, ["queue"])
    assert table.exit_code == 0 and job_id in table.stdout and "EST. START" in table.stdout


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (
            {"estimated_start": "2026-12-02T12:12:00Z", "estimate_basis": "similar_jobs"},
            "about 12 min, from similar jobs",
        ),
        (
            {"estimated_start": "2026-12-02T12:03:10Z", "estimate_basis": "max_runtime"},
            "about 3 min, from max_runtime",
        ),
        (
            {"estimated_start": "2026-12-02T14:14:00Z", "estimate_basis": "similar_jobs"},
            "about 2 h 15 min, from similar jobs",
        ),
        (
            {"estimated_start": "2026-12-05T13:00:00Z", "estimate_basis": "max_runtime"},
            "about 3 days, from max_runtime",
        ),
        (
            {"estimated_start": "2026-12-02T11:59:00Z", "estimate_basis": "max_runtime"},
            "about now, from max_runtime",
        ),
        (
            {"estimated_start": "2026-12-02T12:00:00Z", "estimate_basis": "overdue"},
            "any time now (running jobs overdue)",
        ),
        ({"estimated_start": None, "estimate_basis": "unknown"}, "unknown"),
        # A coordinator without estimates of its own: the reservation's time, from max_runtime.
        ({"waiting": {"estimated_start": "2026-12-02T12:05:00Z"}}, "about 5 min, from max_runtime"),
        ({"waiting": {"estimated_start": None}}, "unknown"),
    ],
)
def test_estimated_starts_say_how_long_and_from_what(entry: dict[str, Any], expected: str) -> None:
    now = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)
    assert sharing_commands.estimate_text(entry, now) == expected


def test_queue_estimates_a_start_from_the_users_similar_jobs(admin: Served, program: Path) -> None:
    # dora's 1-worker CPU jobs ran 8, 10 and 12 minutes; her running one (no max_runtime) started 4 min ago.
    started = utcnow().replace(microsecond=0) - timedelta(minutes=4)
    running = place_task(admin.db, admin.agent_ids[1], digest=DIGEST, port=21050).job_id
    with admin.db.write() as session:
        for minutes in (8, 10, 12):
            finished = started - timedelta(hours=1)
            session.add(
                Job(
                    name="done",
                    state="SUCCEEDED",
                    bundle_digest=DIGEST,
                    command=["python", "train.py"],
                    num_workers=1,
                    submitted_by="dora",
                    created_at=finished - timedelta(minutes=minutes + 1),
                    started_at=finished - timedelta(minutes=minutes),
                    finished_at=finished,
                )
            )
    with admin.db.write() as session:
        session.execute(update(Job).where(Job.id == running).values(submitted_by="dora", started_at=started))
    # High priority: ahead of what earlier tests left waiting (a job ahead that never ends holds it up).
    argv = ["submit", str(program), "-n", "1", "--priority", "high", "--json", "--", "python", "train.py"]
    submitted = runner.invoke(app, argv)
    assert submitted.exit_code == 0, submitted.output
    job_id = json.loads(submitted.stdout)["id"]

    entry = next(entry for entry in mwms("queue", "--limit", "500")["jobs"] if entry["job_id"] == job_id)
    assert entry["estimate_basis"] == "similar_jobs", entry
    assert datetime.fromisoformat(entry["estimated_start"]) == started + timedelta(minutes=10)
    table = runner.invoke(app, ["queue", "--limit", "500"], env={"COLUMNS": "250"})
    assert table.exit_code == 0, table.output
    row = next(line for line in table.stdout.splitlines() if job_id in line)
    assert "about 6 min, from similar jobs" in row, table.stdout


def test_queue_and_team_list_show_each_teams_fair_share(admin: Served) -> None:
    """A team's recent use (device-hours, decayed), its share and its standing (that use over the share, in
    hours of the whole share): after the queue for the teams waiting in it, and in `mwms team list`."""
    with admin.db.write() as session:
        spec = JobCreate(
            bundle_digest=DIGEST, command=["python", "t.py"], workers=1, agents=["not-joined-yet"]
        )
        waiting = create_job(session, spec, submitted_by="fs-team").id
        session.merge(TeamUsage(team="fs-team", kind="cpu", device_seconds=4.5 * 3600, as_of=utcnow()))

    def fs_team() -> dict[str, Any]:
        return next((team for team in mwms("team", "list") if team["team"] == "fs-team"), {})

    # Shown once the coordinator's first reconciler pass has started the usage clock.
    wait_until(lambda: fs_team().get("standing"), 30, "fs-team's standing")
    team = fs_team()
    assert team["usage_device_hours"] == {"gpus": 0.0, "cpu_slots": pytest.approx(4.5, abs=0.001)}
    share = team["share"]["cpu_slots"]
    assert 0 < share <= 2 and team["standing"] == pytest.approx(4.5 / share, rel=0.002)
    standing = f"{team['standing']:.3g} h"

    def row(argv: list[str]) -> str:
        result = runner.invoke(app, argv)
        assert result.exit_code == 0, result.output
        return next(line for line in result.stdout.splitlines() if line.split()[:1] == ["fs-team"])

    listed = row(["team", "list"])
    assert "0 GPU-h, 4.5 CPU-h" in listed and standing in listed, listed
    assert "STANDING" in runner.invoke(app, ["team", "list"]).stdout
    queued = runner.invoke(app, ["queue", "--limit", "500"])
    assert (
        "fair share: within a priority, the team with the lowest STANDING + NOW goes first" in queued.stdout
    )
    line = row(["queue", "--limit", "500"])
    assert standing in line and "0.00" in line and "0 GPU-h, 4.5 CPU-h" in line, line
    with admin.db.write() as session:  # later tests read the queue
        cancel_job(session, waiting)

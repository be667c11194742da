"""Task resources on the coordinator: a job's memory_per_worker and cpus_per_worker are validated, stored,
sent in each StartTask and shown; placement counts memory against each agent's memory_bytes (real SQL),
submit refuses a job whose memory no registered agent can hold, and what agents report of a task's memory
(its peak, the limit applied) is kept and shown. An OOM-killed task's message becomes the job's reason,
over a real Connect stream to a real in-process coordinator."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import inspect, select

from mwms.server.db.engine import Database
from mwms.server.db.migrate import downgrade_to, upgrade_to_head
from mwms.server.db.models import Agent, Bundle, Job, Task, utcnow
from mwms.server.errors import Conflict
from mwms.server.schemas import JobCreate
from mwms.server.services.fleet.agents import Registration, register_agent
from mwms.server.services.job_life.jobs import SubmitPolicy, create_job
from mwms.server.services.job_life.tasks import TaskReport, apply_report
from mwms.server.services.scheduler.placement import AgentCapacity, NoFit, place_gang, place_pinned
from mwms.server.services.scheduler.scheduling import schedule_pending
from mwms.server.services.scheduler.submit_capacity import RegisteredAgent, impossible_reason
from mwms.server.states import TaskState
from mwms.v1 import agent_pb2 as pb
from mwms_testkit.agent_streams import Stream
from mwms_testkit.cluster import wait_until
from mwms_testkit.in_process_coordinator import InProcessCoordinator, coordinator_settings

GiB = 2**30
MiB = 2**20
TiB = 2**40
DIGEST = "d" * 64
OOM = "out of memory: 8 GiB limit (--memory-per-worker)"


def spec(**values: Any) -> JobCreate:
    return JobCreate(**{"bundle_digest": DIGEST, "command": ["python", "t.py"], "workers": 1, **values})


# --- the spec ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("memory", [64 * MiB, 8 * GiB, 64 * TiB, float(8 * GiB)])
def test_memory_per_worker_within_64_mib_and_64_tib_is_accepted(memory: Any) -> None:
    assert spec(memory_per_worker=memory).memory_per_worker == int(memory)


@pytest.mark.parametrize("memory", [0, 64 * MiB - 1, 64 * TiB + 1, -GiB])
def test_memory_per_worker_out_of_bounds_is_refused_saying_the_bounds(memory: int) -> None:
    with pytest.raises(ValidationError) as refused:
        spec(memory_per_worker=memory)
    assert "is not a memory per worker: give bytes from 64 MiB (67108864) to 64 TiB" in str(refused.value)


@pytest.mark.parametrize("memory", ["8G", "8589934592", True, 1.5 * GiB + 0.5])
def test_memory_per_worker_is_a_number_of_bytes(memory: Any) -> None:
    with pytest.raises(ValidationError):
        spec(memory_per_worker=memory)


@pytest.mark.parametrize("cpus", [0.5, 1, 2.0, 1024])
def test_cpus_per_worker_above_0_and_at_most_1024_is_accepted(cpus: float) -> None:
    assert spec(cpus_per_worker=cpus).cpus_per_worker == cpus


@pytest.mark.parametrize("cpus", [0, -1, 1024.5, math.nan, math.inf])
def test_cpus_per_worker_out_of_bounds_is_refused_saying_the_bounds(cpus: float) -> None:
    with pytest.raises(ValidationError) as refused:
        spec(cpus_per_worker=cpus)
    assert "give more than 0 and at most 1024" in str(refused.value)


@pytest.mark.parametrize("cpus", ["2", True])
def test_cpus_per_worker_is_a_number(cpus: Any) -> None:
    with pytest.raises(ValidationError):
        spec(cpus_per_worker=cpus)


def test_the_document_states_the_bounds() -> None:
    properties = JobCreate.model_json_schema()["properties"]
    memory = properties["memory_per_worker"]["anyOf"][0]
    assert (memory["type"], memory["minimum"], memory["maximum"]) == ("integer", 64 * MiB, 64 * TiB)
    cpus = properties["cpus_per_worker"]["anyOf"][0]
    assert (cpus["type"], cpus["exclusiveMinimum"], cpus["maximum"]) == ("number", 0, 1024)


# --- placement, on plain values ---------------------------------------------------------------------------


def cpu_agent(name: str, slots: int, memory: int, used: int = 0) -> AgentCapacity:
    return AgentCapacity(
        agent_id=name,
        name=name,
        address="127.0.0.1",
        device_kind="cpu",
        all_devices=tuple(range(slots)),
        free_devices=tuple(range(slots)),
        port_low=20000,
        port_high=20009,
        memory_bytes=memory,
        memory_used=used,
    )


def test_an_agent_takes_only_the_workers_its_free_memory_holds() -> None:
    agents = [cpu_agent("a", 4, 16 * GiB), cpu_agent("b", 4, 16 * GiB, used=12 * GiB)]
    placed = place_gang(agents, workers=2, gpus_per_worker=0, memory_per_worker=8 * GiB)
    assert isinstance(placed, list)
    assert [t.agent_id for t in placed] == ["a", "a"]  # b has 4 free slots but only 4 GiB free
    assert {t.memory_bytes for t in placed} == {8 * GiB}
    waiting = place_gang(agents, workers=3, gpus_per_worker=0, memory_per_worker=8 * GiB)
    assert isinstance(waiting, NoFit) and waiting.reason.startswith("waiting for memory: needs 3 workers")


def test_an_agent_that_did_not_report_its_memory_is_not_checked() -> None:
    placed = place_gang([cpu_agent("a", 1, 0)], workers=1, gpus_per_worker=0, memory_per_worker=64 * GiB)
    assert isinstance(placed, list)


def test_a_job_whose_memory_no_agent_offers_says_so() -> None:
    agents = [cpu_agent("a", 4, 6 * GiB), cpu_agent("b", 4, 4 * GiB)]
    never = place_gang(agents, workers=1, gpus_per_worker=0, memory_per_worker=8 * GiB)
    assert isinstance(never, NoFit)
    assert never.reason.startswith("needs 8 GiB per worker; the largest agent (a) offers 6 GiB")
    pinned = place_pinned(agents, ["b"], 0, memory_per_worker=8 * GiB)
    assert isinstance(pinned, NoFit) and "agent b offers 4 GiB in all" in pinned.reason


# --- placement, through a scheduling pass on a real SQLite database ----------------------------------------


def join(session: Any, name: str, slots: int, memory: int) -> str:
    devices = [{"kind": "cpu", "index": i, "name": f"slot-{i}"} for i in range(slots)]
    reg = Registration(name, name, "127.0.0.1", 20000, 20010, devices, "t", memory_bytes=memory)
    return register_agent(session, reg, 300).id


@pytest.mark.db_seed(DIGEST)
def test_a_job_that_fits_no_agents_free_memory_waits_saying_so_while_one_that_fits_runs(db: Database) -> None:
    base = utcnow() - timedelta(minutes=1)
    with db.write() as session:
        big = join(session, "big", 2, 16 * GiB)
        small = join(session, "small", 2, 6 * GiB)
        jobs = {}
        for i, (name, memory) in enumerate((("first", 12 * GiB), ("blocked", 8 * GiB), ("fits", 4 * GiB))):
            job = create_job(session, spec(name=name, memory_per_worker=memory), "alice")
            job.created_at = base + timedelta(seconds=i)  # placed in this order
            jobs[name] = job.id
    with db.write() as session:
        schedule_pending(session)
    with db.read() as session:
        first, blocked, fits = (session.get(Job, jobs[n]) for n in ("first", "blocked", "fits"))
        assert (first.state, blocked.state, fits.state) == ("SCHEDULED", "PENDING", "SCHEDULED")
        where = dict(session.execute(select(Task.job_id, Task.agent_id)).all())
        assert where == {first.id: big, fits.id: small}  # small's 6 GiB could never hold 12
        assert blocked.waiting["kind"] == "no_fit" and blocked.waiting["short_of"] == "memory"
        assert blocked.waiting["memory_per_worker"] == 8 * GiB
        assert blocked.reason.startswith(
            "waiting for memory: needs 1 worker × 1 CPU slot with 8 GiB each; the agents with free CPU slots "
            "have too little memory left for it"
        ), blocked.reason
    # The next pass reads the placed tasks' memory from the database: big has 4 GiB left, small 2 GiB.
    with db.write() as session:
        schedule_pending(session)
    with db.read() as session:
        blocked = session.get(Job, jobs["blocked"])
        assert blocked.state == "PENDING" and "with 8 GiB each" in blocked.reason, blocked.reason
        assert session.scalar(select(Task.id).where(Task.job_id == blocked.id)) is None


# --- submit ----------------------------------------------------------------------------------------------

AGENTS = [
    RegisteredAgent("id-big", "big", "cpu", 2, 16 * GiB),
    RegisteredAgent("id-small", "small", "cpu", 2, 6 * GiB),
]


def test_submit_refuses_more_memory_per_worker_than_any_registered_agent_offers() -> None:
    assert impossible_reason(AGENTS, 1, 0, None, memory_per_worker=16 * GiB) is None
    assert impossible_reason(AGENTS, 1, 0, None, memory_per_worker=32 * GiB) == (
        "needs 32 GiB per worker; the largest registered agent (big) offers 16 GiB to its tasks: lower "
        "--memory-per-worker to at most 16 GiB, or add a machine with more memory"
    )
    assert impossible_reason(AGENTS, 2, 0, None, memory_per_worker=12 * GiB) == (
        "needs 2 workers × 1 CPU slot and 12 GiB, but the memory of the 2 registered agents (big 16 GiB, "
        "small 6 GiB) holds at most 1 such worker even when idle: lower --workers to at most 1 or "
        "--memory-per-worker, or add machines"
    )
    assert impossible_reason(AGENTS, 2, 0, ["small", "small"], memory_per_worker=4 * GiB) == (
        "2 workers × 4 GiB are pinned to agent small, which offers 6 GiB to its tasks: pin fewer workers "
        "to it, or lower --memory-per-worker"
    )


def test_an_agent_that_did_not_report_its_memory_may_hold_any() -> None:
    unknown = [*AGENTS, RegisteredAgent("id-old", "old", "cpu", 1, 0)]
    assert impossible_reason(unknown, 1, 0, None, memory_per_worker=32 * GiB) is None


@pytest.mark.db_seed(DIGEST)
def test_create_job_refuses_memory_no_registered_agent_offers(db: Database) -> None:
    policy = SubmitPolicy(refuse_impossible=True)
    with db.write() as session:
        join(session, "big", 2, 16 * GiB)
        with pytest.raises(Conflict) as refused:
            create_job(session, spec(memory_per_worker=32 * GiB), "alice", policy)
        assert str(refused.value).startswith("this job can never be placed: needs 32 GiB per worker")
        job = create_job(session, spec(memory_per_worker=16 * GiB, cpus_per_worker=2.5), "alice", policy)
        assert (job.memory_per_worker, job.cpus_per_worker) == (16 * GiB, 2.5)


# --- what agents report -----------------------------------------------------------------------------------


@pytest.mark.db_seed(DIGEST)
def test_reports_keep_the_highest_peak_and_the_limit_applied(db: Database) -> None:
    with db.write() as session:
        agent_id = join(session, "a", 1, 8 * GiB)
        create_job(session, spec(memory_per_worker=4 * GiB), "alice")
    with db.write() as session:
        schedule_pending(session)
    with db.write() as session:
        agent = session.get(Agent, agent_id)
        task = session.scalars(select(Task)).one()
        for state, peak, limit in (
            (TaskState.RUNNING, 2 * GiB, 4 * GiB),
            (TaskState.RUNNING, 1 * GiB, 0),  # lower, and no limit: both kept
            (TaskState.RUNNING, 0, 0),  # unknown: nothing changes
        ):
            report = TaskReport(task.id, state, pid=7, peak_memory_bytes=peak, memory_limit_bytes=limit)
            apply_report(session, agent, report, backoff_base_s=1)
            assert (task.peak_memory_bytes, task.memory_limit_bytes) == (2 * GiB, 4 * GiB)


# --- the migration ----------------------------------------------------------------------------------------


def test_the_migration_adds_and_removes_the_columns(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'm.db'}")
    added = {
        "agents": {"memory_bytes"},
        "jobs": {"memory_per_worker", "cpus_per_worker"},
        "tasks": {"peak_memory_bytes", "memory_limit_bytes"},
    }

    def columns(table: str) -> set[str]:
        return {c["name"] for c in inspect(db.engine).get_columns(table)}

    upgrade_to_head(db.engine)
    assert all(names <= columns(table) for table, names in added.items())
    downgrade_to(db.engine, "0012")
    assert all(not names & columns(table) for table, names in added.items())
    upgrade_to_head(db.engine)
    assert all(names <= columns(table) for table, names in added.items())
    db.dispose()


# --- over a real Connect stream ---------------------------------------------------------------------------

JOIN_TOKEN = "join-token-for-task-memory-tests-0123456789"
ADMIN_TOKEN = "mwms_admin-token-for-task-memory-tests-0123"


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[InProcessCoordinator]:
    settings = coordinator_settings(
        tmp_path / "coordinator", join_token=JOIN_TOKEN, admin_token=ADMIN_TOKEN, agent_timeout_s=300
    )
    with ExitStack() as stack:
        served = InProcessCoordinator.start(stack, settings, admin_token=ADMIN_TOKEN)
        with served.db.write() as session:
            session.add(Bundle(digest=DIGEST, size=1, archive_format="tar.gz"))
        yield served


def test_an_oom_killed_task_fails_its_job_with_the_agents_message_and_its_peak_memory_is_shown(
    coordinator: InProcessCoordinator,
) -> None:
    request = pb.RegisterRequest(
        name="box",
        hostname="box",
        advertise_address="127.0.0.1",
        port_range_low=22000,
        port_range_high=22099,
        devices=[pb.Device(kind=pb.DEVICE_KIND_CPU_SLOT, index=0, name="cpu-slot-0")],
        version="test",
        join_token=JOIN_TOKEN,
        memory_bytes=16 * GiB,
    )
    registered = coordinator.stub.Register(request, timeout=10)
    agents = coordinator.http.get("/api/v1/agents").json()
    assert [a["memory_bytes"] for a in agents] == [16 * GiB]

    body = {"bundle_digest": DIGEST, "command": ["python", "t.py"], "workers": 1}
    refused = coordinator.http.post("/api/v1/jobs", json={**body, "memory_per_worker": 32 * MiB})
    assert refused.status_code == 422 and "64 MiB" in refused.json()["detail"], refused.text
    too_big = coordinator.http.post("/api/v1/jobs", json={**body, "memory_per_worker": 32 * GiB})
    assert too_big.status_code == 409, too_big.text
    assert (
        "needs 32 GiB per worker; the largest registered agent (box) offers 16 GiB"
        in too_big.json()["detail"]
    )
    created = coordinator.http.post(
        "/api/v1/jobs",
        json={**body, "memory_per_worker": 8 * GiB, "cpus_per_worker": 2, "restart": {"max_restarts": 0}},
    )
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    assert (created.json()["memory_per_worker"], created.json()["cpus_per_worker"]) == (8 * GiB, 2.0)

    stream = Stream(coordinator.stub, registered.credential)
    try:
        stream.send(hello=pb.Hello(agent_id=registered.agent_id))
        start = stream.next("start", timeout=20)
        assert (start.job_id, start.memory_limit_bytes, start.cpus) == (job_id, 8 * GiB, 2.0)
        running = pb.TaskReport(
            task_id=start.task_id,
            state=pb.TASK_STATE_RUNNING,
            pid=4242,
            peak_memory_bytes=3 * GiB,
            memory_limit_bytes=8 * GiB,
        )
        stream.send(task=running)
        killed = pb.TaskReport(
            task_id=start.task_id,
            state=pb.TASK_STATE_FAILED,
            exit_code=137,
            message=OOM,
            pid=4242,
            peak_memory_bytes=8 * GiB,
            memory_limit_bytes=8 * GiB,
        )
        stream.send(task=killed)
        stream.next("ack", where=lambda ack: ack.task_id == start.task_id and ack.final_state)

        def failed() -> dict[str, Any] | None:
            job = coordinator.http.get(f"/api/v1/jobs/{job_id}").json()
            return job if job["state"] == "FAILED" else None

        job = wait_until(failed, 10, "the job to fail")
    finally:
        stream.close()
    assert OOM in job["reason"], job["reason"]
    (task,) = job["tasks"]
    assert (task["state"], task["exit_code"], task["message"]) == ("FAILED", 137, OOM)
    assert (task["peak_memory_bytes"], task["memory_limit_bytes"]) == (8 * GiB, 8 * GiB)
    assert job["attempt_history"][-1]["tasks"][0]["peak_memory_bytes"] == 8 * GiB

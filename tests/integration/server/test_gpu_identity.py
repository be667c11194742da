"""Each GPU by its identity as well as its host index: the device node an agent registers, the UUIDs of the
GPUs a task holds in the API (agents list, job, job devices, device series), and the note a GPU job's
SCHEDULED reason gets when several of its workers share one agent. A real SQLite database and app."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from mwms.server.app import create_app
from mwms.server.db.engine import Database
from mwms.server.db.models import Attempt, Job, JobEvent, Task, utcnow
from mwms.server.rpc.convert import registration
from mwms.server.schemas import JobCreate
from mwms.server.services.fleet.agents import register_agent
from mwms.server.services.job_life.jobs import create_job
from mwms.server.services.observing.device_telemetry import IncomingSample, sample_row, store_rows
from mwms.server.services.scheduler.placement import TaskPlacement, shared_agent_note
from mwms.server.services.scheduler.scheduling import schedule_pending
from mwms.server.settings import Settings
from mwms.server.states import JobState
from mwms.v1 import agent_pb2 as pb

DIGEST = "7" * 64
ADMIN_TOKEN = "mwms_admin-token-for-gpu-identity-tests-0"
pytestmark = pytest.mark.db_seed(DIGEST)


def gpu_request(name: str, gpus: int, *, nodes: bool = True) -> pb.RegisterRequest:
    """A Register request of an agent with `gpus` GPUs, UUIDs GPU-<name>-<i>; with device nodes unless
    `nodes` is false (an agent older than the field)."""
    return pb.RegisterRequest(
        name=name,
        hostname=name,
        advertise_address="127.0.0.1",
        port_range_low=20000,
        port_range_high=20099,
        devices=[
            pb.Device(
                kind=pb.DEVICE_KIND_GPU,
                index=i,
                name="H200",
                uuid=f"GPU-{name}-{i}",
                memory_mib=143771,
                node=f"/dev/nvidia{i}" if nodes else "",
            )
            for i in range(gpus)
        ],
        version="test",
    )


def register(db: Database, request: pb.RegisterRequest) -> str:
    """Registers the agent the way the gRPC servicer does (convert.registration); returns its id."""
    with db.write() as session:
        return register_agent(session, registration(request), 30).id


def cpu_request(name: str, slots: int) -> pb.RegisterRequest:
    return pb.RegisterRequest(
        name=name,
        hostname=name,
        advertise_address="127.0.0.1",
        port_range_low=20000,
        port_range_high=20099,
        devices=[pb.Device(kind=pb.DEVICE_KIND_CPU_SLOT, index=i, name=f"slot{i}") for i in range(slots)],
        version="test",
    )


def add_running_job(db: Database, tasks: list[tuple[str, str, list[int]]]) -> str:
    """A RUNNING job whose first attempt has one running task per (agent id, kind, device indices)."""
    started = utcnow() - timedelta(minutes=2)
    with db.write() as session:
        job = Job(name="ids", state="RUNNING", bundle_digest=DIGEST, command=["x"], num_workers=len(tasks))
        session.add(job)
        session.flush()
        attempt = Attempt(job_id=job.id, number=1, state="ACTIVE")
        session.add(attempt)
        session.flush()
        for index, (agent_id, kind, indices) in enumerate(tasks):
            session.add(
                Task(
                    job_id=job.id,
                    attempt_id=attempt.id,
                    attempt_number=1,
                    index=index,
                    agent_id=agent_id,
                    host="127.0.0.1",
                    port=20000 + index,
                    device_kind=kind,
                    device_indices=indices,
                    state="RUNNING",
                    started_at=started,
                )
            )
        return job.id


@pytest.fixture
def api(db: Database, tmp_path: Path) -> Iterator[TestClient]:
    """A real app over the `db` fixture's database, with the admin token."""
    settings = Settings(
        data_dir=tmp_path / "coordinator", grpc_port=0, admin_token=ADMIN_TOKEN, db_url=str(db.engine.url)
    )
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        client.headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
        yield client


def test_registration_keeps_each_devices_node_and_an_old_agent_gets_empty_ones(db: Database, api) -> None:
    new = registration(gpu_request("gpu-new", 2))
    assert [(d["index"], d["uuid"], d["node"]) for d in new.devices] == [
        (0, "GPU-gpu-new-0", "/dev/nvidia0"),
        (1, "GPU-gpu-new-1", "/dev/nvidia1"),
    ]
    register(db, gpu_request("gpu-new", 2))
    register(db, gpu_request("gpu-old", 1, nodes=False))

    agents = {a["name"]: a for a in api.get("/api/v1/agents").json()}
    assert [(d["uuid"], d["node"]) for d in agents["gpu-new"]["devices"]] == [
        ("GPU-gpu-new-0", "/dev/nvidia0"),
        ("GPU-gpu-new-1", "/dev/nvidia1"),
    ]
    assert [(d["uuid"], d["node"]) for d in agents["gpu-old"]["devices"]] == [("GPU-gpu-old-0", "")]


def test_the_api_gives_each_tasks_gpu_uuids_in_the_order_of_its_indices(db: Database, api) -> None:
    gpu_a = register(db, gpu_request("gpu-a", 4))
    old = gpu_request("gpu-b", 2)
    old.devices[1].uuid = ""  # a GPU its agent sent no UUID for
    gpu_b = register(db, old)
    cpu = register(db, cpu_request("cpu-a", 2))
    job_id = add_running_job(db, [(gpu_a, "gpu", [3, 1]), (gpu_b, "gpu", [1, 0]), (cpu, "cpu", [1])])
    now = utcnow()
    with db.write() as session:
        store_rows(session, [sample_row(gpu_a, IncomingSample(i, 50.0, 10, 100, 40.0), now) for i in (1, 3)])

    expected = [
        (0, [3, 1], ["GPU-gpu-a-3", "GPU-gpu-a-1"]),
        (1, [1, 0], ["", "GPU-gpu-b-0"]),
        (2, [1], []),
    ]
    job = api.get(f"/api/v1/jobs/{job_id}").json()
    assert [(t["index"], t["device_indices"], t["device_uuids"]) for t in job["tasks"]] == expected
    assert job["attempt_history"][0]["tasks"] == job["tasks"]

    agents = {a["name"]: a for a in api.get("/api/v1/agents").json()}
    held = [
        (t["device_indices"], t["device_uuids"])
        for n in ("gpu-a", "gpu-b", "cpu-a")
        for t in agents[n]["tasks"]
    ]
    assert held == [(indices, uuids) for _, indices, uuids in expected]

    devices = api.get(f"/api/v1/jobs/{job_id}/devices").json()
    assert [(t["task_index"], t["device_indices"], t["device_uuids"]) for t in devices["tasks"]] == expected
    first = devices["tasks"][0]
    assert [(s["index"], s["uuid"], bool(s["points"])) for s in first["series"]] == [
        (3, "GPU-gpu-a-3", True),
        (1, "GPU-gpu-a-1", True),
    ]

    # The newest samples, as the agent's stream leaves them in this replica's memory.
    latest = api.app.state.wiring.devices.latest  # type: ignore[attr-defined]
    latest.put(gpu_a, [IncomingSample(3, 50.0, 10, 100, 40.0)], now)
    answer = api.get("/api/v1/agents/gpu-a/devices").json()
    assert [(s["index"], s["uuid"]) for s in answer["series"]] == [(1, "GPU-gpu-a-1"), (3, "GPU-gpu-a-3")]
    assert [(s["index"], s["uuid"]) for s in answer["latest"]] == [(3, "GPU-gpu-a-3")]
    newest = {a["agent_id"]: a["devices"] for a in api.get("/api/v1/devices").json()}
    assert [(s["index"], s["uuid"]) for s in newest[gpu_a]] == [(3, "GPU-gpu-a-3")]


def scheduled_reason(db: Database, workers: int, gpus_per_worker: int) -> tuple[str, str]:
    """Submits a job, runs one scheduler pass; returns its reason and its SCHEDULED event's reason."""
    with db.write() as session:
        job_id = create_job(
            session,
            JobCreate(
                bundle_digest=DIGEST,
                command=["python", "x.py"],
                workers=workers,
                gpus_per_worker=gpus_per_worker,
            ),
        ).id
    with db.write() as session:
        schedule_pending(session)
    with db.read() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.state == JobState.SCHEDULED.value, job and job.reason
        event = session.scalars(
            select(JobEvent.reason).where(
                JobEvent.job_id == job_id, JobEvent.to_state == JobState.SCHEDULED.value
            )
        ).one()
        return job.reason, event


def test_gpu_workers_placed_on_one_agent_get_a_note_in_the_scheduled_reason(db: Database) -> None:
    register(db, gpu_request("gpu-a", 2))
    reason, event = scheduled_reason(db, workers=2, gpus_per_worker=1)
    assert reason == event
    assert "; workers 0 and 1 share agent gpu-a: they share the job's /dev/shm there" in reason
    assert "(--workers 1 --gpus-per-worker 2), where MirroredStrategy uses NVLink" in reason


def test_no_note_for_gpu_workers_on_different_agents_nor_for_a_cpu_job(db: Database) -> None:
    register(db, gpu_request("gpu-a", 1))
    register(db, gpu_request("gpu-b", 1))
    reason, _ = scheduled_reason(db, workers=2, gpus_per_worker=1)
    assert "2 workers on 2 agents" in reason and "share" not in reason

    register(db, cpu_request("cpu-a", 2))  # the GPU agents are full: both CPU workers go here
    reason, _ = scheduled_reason(db, workers=2, gpus_per_worker=0)
    assert "2 workers on 1 agent" in reason and "share" not in reason


def test_the_note_stays_bounded_however_many_workers_share_agents() -> None:
    def on(agent: str, index: int) -> TaskPlacement:
        return TaskPlacement(index, agent, "127.0.0.1", 20000 + index, "gpu", (index % 8,))

    crowded = [on(f"a{i // 10}", i) for i in range(60)]  # ten workers on each of six agents
    note = shared_agent_note(crowded, {"a0": "gpu-a0"})
    assert note.startswith("; workers 0, 1, 2, 3 and 6 more share agent gpu-a0, workers 10, 11, 12, 13 ")
    assert "3 more agents hold several:" in note and "a5" not in note
    assert "(--workers 6 --gpus-per-worker 10)" in note and len(note) < 600

    uneven = [on("a", 0), on("a", 1), on("b", 2)]
    assert "workers 0 and 1 share agent a:" in shared_agent_note(uneven, {})
    assert "(--workers <machines> --gpus-per-worker <N>)" in shared_agent_note(uneven, {})
    assert shared_agent_note([on("a", 0), on("b", 1)], {}) == ""
    cpu = [TaskPlacement(i, "a", "127.0.0.1", 20000 + i, "cpu", (i,)) for i in range(2)]
    assert shared_agent_note(cpu, {}) == ""

"""What tests of an in-process coordinator share: an agent's Register request, a migrated database holding a
bundle and one-slot CPU agents, and a job with one task placed on an agent, written straight into the database
(no scheduler involved)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mwms.server.db.engine import Database
from mwms.server.db.migrate import upgrade_to_head
from mwms.server.db.models import Attempt, Bundle, Job, Task, utcnow
from mwms.server.services.fleet.agents import Registration, register_agent
from mwms.v1 import agent_pb2 as pb


def register_request(
    name: str, join_token: str, *, hostname: str | None = None, port_low: int = 20000
) -> pb.RegisterRequest:
    """A Register request for a one-CPU-slot agent on loopback."""
    return pb.RegisterRequest(
        name=name,
        hostname=hostname if hostname is not None else name,
        advertise_address="127.0.0.1",
        port_range_low=port_low,
        port_range_high=port_low + 99,
        devices=[pb.Device(kind=pb.DEVICE_KIND_CPU_SLOT, index=0, name="cpu-slot-0")],
        version="test",
        join_token=join_token,
    )


def seeded_database(path: Path, digest: str | None, agent_names: Iterable[str]) -> Database:
    """A migrated SQLite database at `path` with bundle `digest` (none when None) and a one-CPU-slot agent
    per name, online."""
    database = Database(f"sqlite:///{path}")
    upgrade_to_head(database.engine)
    slot = [{"kind": "cpu", "index": 0, "name": "s"}]
    with database.write() as session:
        if digest is not None:
            session.add(Bundle(digest=digest, size=1, archive_format="tar.gz"))
        for name in agent_names:
            register_agent(session, Registration(name, name, "127.0.0.1", 20000, 20010, slot, "t"), 30)
    return database


def place_task(
    db: Database,
    agent_id: str,
    *,
    digest: str,
    bundle_size: int = 1,
    state: str = "RUNNING",
    job_state: str = "RUNNING",
    options: dict[str, Any] | None = None,
    port: int = 20000,
) -> Task:
    """A job in `job_state` whose first attempt has one task in `state` on `agent_id`; its bundle row is
    made when missing (the archive itself is the caller's business)."""
    with db.write() as session:
        if session.get(Bundle, digest) is None:
            session.add(Bundle(digest=digest, size=bundle_size, archive_format="tar.gz"))
        job = Job(
            name="j",
            state=job_state,
            bundle_digest=digest,
            command=["python", "train.py"],
            num_workers=1,
            options=options or {},
            started_at=utcnow(),
        )
        session.add(job)
        session.flush()
        attempt = Attempt(job_id=job.id, number=1, state="ACTIVE")
        session.add(attempt)
        session.flush()
        task = Task(
            job_id=job.id,
            attempt_id=attempt.id,
            attempt_number=1,
            index=0,
            agent_id=agent_id,
            host="127.0.0.1",
            port=port,
            device_kind="cpu",
            device_indices=[0],
            state=state,
        )
        session.add(task)
        session.flush()
        return task

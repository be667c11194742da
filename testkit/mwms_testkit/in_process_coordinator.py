"""One coordinator inside the test process: the real app (lifespan, migrations, background loops, SQLite in
its data dir) behind a TestClient, its gRPC server on a loopback port it bound itself (port 0: no free-port
race), and a stub for that server; with the helpers most tests need (an API token, an agent registered).
Test modules subclass InProcessCoordinator for the few helpers of their own."""

from __future__ import annotations

import asyncio
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
from fastapi import FastAPI
from fastapi.testclient import TestClient

from mwms.server.app import create_app, replica_identity
from mwms.server.db.engine import Database
from mwms.server.live.hub import AgentHub
from mwms.server.live.liveness import Liveness
from mwms.server.live.loops import BackgroundLoops
from mwms.server.live.pass_locks import PassLocks
from mwms.server.live.task_progress import TaskProgress
from mwms.server.services.auth.tokens import Role, create_api_token
from mwms.server.settings import Settings
from mwms.v1 import agent_pb2_grpc
from mwms_testkit.coordinator_rows import register_request

CoordinatorType = TypeVar("CoordinatorType", bound="InProcessCoordinator")


def coordinator_settings(data_dir: Path, **values: Any) -> Settings:
    """Settings of an in-process coordinator in `data_dir`, with gRPC on a port the kernel picks."""
    return Settings(data_dir=data_dir, grpc_port=0, **values)


@dataclass
class InProcessCoordinator:
    settings: Settings
    http: TestClient
    db: Database
    stub: agent_pb2_grpc.AgentServiceStub
    app: FastAPI  # for its state: the wiring (hub, writers, loops)

    @classmethod
    def start(
        cls: type[CoordinatorType], stack: ExitStack, settings: Settings, *, admin_token: str | None = None
    ) -> CoordinatorType:
        """Starts the app in `settings` and stops it when `stack` closes; with `admin_token`, every request
        of `http` carries it as a bearer token."""
        app = create_app(settings)
        http = stack.enter_context(TestClient(app, base_url="http://127.0.0.1"))
        if admin_token is not None:
            http.headers["Authorization"] = f"Bearer {admin_token}"
        channel = stack.enter_context(grpc.insecure_channel(f"127.0.0.1:{app.state.grpc_port}"))
        return cls(settings, http, app.state.wiring.db, agent_pb2_grpc.AgentServiceStub(channel), app)

    def api_token(self, user: str, role: Role = Role.USER) -> str:
        """A new API token of `user` with `role`, written straight into the database: its secret."""
        with self.db.write() as session:
            return create_api_token(session, user, role)[1]

    def auth(self, user: str, role: Role = Role.USER) -> dict[str, str]:
        """Request headers carrying a new API token of `user`."""
        return {"Authorization": f"Bearer {self.api_token(user, role)}"}

    def register_agent(self, name: str, join_token: str, port_low: int = 20000) -> str:
        """Registers a one-CPU-slot agent over gRPC (no stream opened): its id."""
        return self.stub.Register(register_request(name, join_token, port_low=port_low), timeout=10).agent_id


def background_loops(db: Database, settings: Settings, liveness: Liveness) -> BackgroundLoops:
    """The coordinator's background loops on `db`, not started: a test drives their ticks itself. Call it
    inside the running event loop."""
    return BackgroundLoops(
        db,
        settings,
        AgentHub(asyncio.get_running_loop(), db),
        liveness,
        replica=replica_identity(settings),
        passes=PassLocks(db),
        progress=TaskProgress(),
    )

"""One coordinator inside the test process: the real app (lifespan, migrations, background loops, SQLite in
its data dir) behind a TestClient, its gRPC server on a loopback port it bound itself (port 0: no free-port
race), and a stub for that server. Test modules subclass InProcessCoordinator for the few helpers of their own."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
from fastapi import FastAPI
from fastapi.testclient import TestClient

from mwms.server.app import create_app
from mwms.server.db.engine import Database
from mwms.server.settings import Settings
from mwms.v1 import agent_pb2_grpc

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

"""Request-scoped access to the coordinator's database, settings and wake-ups."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from server.db.engine import Database
from server.settings import Settings


@dataclass
class Runtime:
    """What the app factory wires together and routers need."""

    db: Database
    settings: Settings
    poke_scheduler: object  # Callable[[], None]
    wake_agents: object  # Callable[[list[str] | None], None]


def runtime(request: Request) -> Runtime:
    return request.app.state.runtime


def read_session(request: Request) -> Iterator[Session]:
    with runtime(request).db.read() as session:
        yield session


def write_session(request: Request) -> Iterator[Session]:
    """The request owns the transaction: committed when the handler returns without error."""
    with runtime(request).db.write() as session:
        yield session


ReadSession = Annotated[Session, Depends(read_session)]
WriteSession = Annotated[Session, Depends(write_session)]
RuntimeDep = Annotated[Runtime, Depends(runtime)]

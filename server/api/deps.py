"""Request-scoped access to the coordinator's database, settings and wake-ups."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
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
    poke_scheduler: Callable[[], None]
    wake_agents: Callable[[Iterable[str] | None], None]


def runtime(request: Request) -> Runtime:
    return request.app.state.runtime


def read_session(request: Request) -> Iterator[Session]:
    with runtime(request).db.read() as session:
        yield session


ReadSession = Annotated[Session, Depends(read_session)]
RuntimeDep = Annotated[Runtime, Depends(runtime)]

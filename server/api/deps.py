"""Request-scoped access to the coordinator's wiring: database, settings, wake-ups and live machinery."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from mwms.server.live.wiring import Wiring


def wiring(request: Request) -> Wiring:
    """What the app's lifespan built (server/live/wiring.py)."""
    return request.app.state.wiring


def read_session(request: Request) -> Iterator[Session]:
    with wiring(request).db.read() as session:
        yield session


ReadSession = Annotated[Session, Depends(read_session)]
WiringDep = Annotated[Wiring, Depends(wiring)]

"""Request-scoped access to the coordinator's wiring: database, settings, wake-ups and live machinery."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from mwms.server.api.view_cache import ViewCache
from mwms.server.live.wiring import Wiring


def wiring(request: Request) -> Wiring:
    """What the app's lifespan built (server/live/wiring.py)."""
    return request.app.state.wiring


def read_session(request: Request) -> Iterator[Session]:
    with wiring(request).db.read() as session:
        yield session


def view_cache(request: Request) -> ViewCache:
    """The polled lists' answers, shared between callers for a second (server/api/view_cache.py)."""
    return request.app.state.view_cache


ReadSession = Annotated[Session, Depends(read_session)]
WiringDep = Annotated[Wiring, Depends(wiring)]
Views = Annotated[ViewCache, Depends(view_cache)]

"""The fake API as one FastAPI app, and the ways tests serve it over real HTTP (served_app.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import FastAPI

from mwms.server.api import dashboard
from mwms.server.api.security_headers import SecurityHeadersMiddleware
from mwms_testkit.fake_api import auth, cluster, jobs
from mwms_testkit.fake_api.state import FakeState
from mwms_testkit.served_app import served


def create_app(state: FakeState) -> FastAPI:
    """The fake /api/v1 over `state`, then the dashboard's own router, as the coordinator serves them."""
    app = FastAPI()
    app.state.fake = state
    app.middleware("http")(auth.authenticate)
    app.add_middleware(SecurityHeadersMiddleware)
    for router in (auth.router, jobs.router, cluster.router, dashboard.router):
        app.include_router(router)
    return app


@contextmanager
def serve_fake_api(port: int = 0, state: FakeState | None = None) -> Iterator[tuple[str, FakeState]]:
    """Serves the fake API over `state` (default: a fresh, unseeded one) on 127.0.0.1:<port, default free>
    in a thread; yields (its base URL, its state)."""
    state = FakeState() if state is None else state
    with served(create_app(state), port=port) as url:
        yield url, state

"""REST errors never show SQL, tracebacks or exception class names."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from mwms.server.api.errors import INTERNAL_ERROR, install_error_handlers


def test_an_unexpected_error_gives_a_plain_500():
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    def boom() -> None:
        raise OperationalError("SELECT secret FROM tokens WHERE id = ?", ("x",), Exception("disk I/O error"))

    response = TestClient(app, raise_server_exceptions=False).get("/boom")
    assert response.status_code == 500
    assert response.json() == {"detail": INTERNAL_ERROR}
    for leak in ("SELECT", "OperationalError", "Traceback", "disk I/O"):
        assert leak not in response.text

"""Slips in where the CLI and `mwms.Client` point and what token they send, each answered fast with one
sentence that says what to do: a port nothing listens on (fails within 3 s), the coordinator's gRPC port
given as --api (named as such, at once), a retry announced at once on stderr, and an expired token (says
when it expired and that a new one is needed, not to set the variable that holds it)."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from mwms import Client
from mwms.cli.errors import ExitCode
from mwms.cli.main import app
from mwms.client.transport import Transport
from mwms.errors import CoordinatorUnreachable, NotACoordinator, Unauthorized
from mwms_testkit.cluster import Cluster, wait_until

runner = CliRunner()


def port_nothing_listens_on() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed again: connections to it are refused


def test_a_port_nothing_listens_on_fails_within_3_s_saying_what_to_check() -> None:
    api = f"http://127.0.0.1:{port_nothing_listens_on()}"
    started = time.monotonic()
    result = runner.invoke(app, ["jobs", "--api", api])
    took = time.monotonic() - started
    assert result.exit_code == ExitCode.UNREACHABLE, result.output
    assert took < 3.0, f"took {took:.1f} s"
    assert (
        f"error: nothing answers at {api}: is the coordinator running? start one with `mwms server` "
        "or check --api/MWMS_API"
    ) in result.stderr

    started = time.monotonic()
    with Client(api) as client, pytest.raises(CoordinatorUnreachable, match="nothing answers at"):
        client.agents()
    assert time.monotonic() - started < 3.0


class _Unavailable(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class _SomeOtherWebsite(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        body = b"<html><body>404 page not found</body></html>"
        self.send_response(404)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def other_website() -> Iterator[str]:
    """A web server that is not the coordinator: a 404 page in HTML for every path."""
    yield from serve(_SomeOtherWebsite)


def test_another_web_server_is_said_not_to_be_a_coordinator(other_website: str) -> None:
    result = runner.invoke(app, ["status", "job0001", "--api", other_website])
    assert result.exit_code == ExitCode.UNREACHABLE, result.output
    assert (
        f"error: {other_website} answered HTTP 404 without the API's JSON to /api/v1/jobs/job0001: it is not "
        "an mwms coordinator"
    ) in result.stderr
    assert "not found:" not in result.stderr  # not "no such job"


@pytest.fixture
def unavailable_api() -> Iterator[str]:
    """An HTTP server that answers 503 to everything, as a proxy before a restarting coordinator does."""
    yield from serve(_Unavailable)


def test_a_retry_is_announced_at_once_then_the_request_gives_up(unavailable_api: str) -> None:
    notices: list[tuple[float, str]] = []
    started = time.monotonic()
    transport = Transport(
        unavailable_api, retry_seconds=1.5, on_retry=lambda text: notices.append((time.monotonic(), text))
    )
    with pytest.raises(CoordinatorUnreachable):
        transport.request("GET", "/api/v1/jobs")
    transport.close()
    assert len(notices) == 1  # once per request, not once per retry
    at, text = notices[0]
    assert at - started < 0.5
    assert text.startswith(f"cannot get an answer from {unavailable_api} (HTTP 503); retrying for up to ")


@pytest.mark.e2e
def test_the_grpc_port_given_as_the_api_is_named_as_such_at_once(cluster: Cluster) -> None:
    api = f"http://127.0.0.1:{cluster.grpc_port}"
    started = time.monotonic()
    result = runner.invoke(app, ["jobs", "--api", api, "--token", cluster.admin_token])
    assert time.monotonic() - started < 3.0
    assert result.exit_code == ExitCode.UNREACHABLE, result.output
    assert (
        f"error: {api} answers HTTP/2 only, as the coordinator's gRPC port for agents does" in result.stderr
    )
    assert "the API is on the coordinator's HTTP port (default 8080)" in result.stderr
    assert "mwms server" not in result.stderr  # it is running: no advice to start one
    assert cluster.admin_token not in result.output
    with Client(api, cluster.admin_token) as client, pytest.raises(NotACoordinator):
        client.agents()


@pytest.mark.e2e
def test_an_expired_token_says_when_it_expired_and_that_a_new_one_is_needed(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    created = cluster.http.post(
        "/api/v1/tokens", json={"user": "dora", "role": "viewer", "expires_in_seconds": 1}
    )
    assert created.status_code == 201, created.text
    secret, expires_at = created.json()["token"], created.json()["expires_at"]
    wait_until(
        lambda: cluster.client(secret).get("/api/v1/jobs").status_code == 401, 30, "the token to expire"
    )
    answer = cluster.client(secret).get("/api/v1/jobs")
    stamp = expires_at[:19].replace("T", " ") + " UTC"
    assert answer.json()["detail"].startswith(f"the token expired at {stamp}: ask an admin for a new one")
    # When, as data: clients read it, not the wording.
    assert answer.json()["expired_at"][:19] == expires_at[:19], answer.json()

    monkeypatch.setenv("MWMS_TOKEN", secret)
    result = runner.invoke(app, ["jobs", "--api", cluster.api])
    assert result.exit_code == ExitCode.NOT_AUTHORIZED, result.output
    assert (
        f"refused the token from MWMS_TOKEN (it expired at {stamp}); ask an admin for a new one "
        "(`mwms token create`) and put it in MWMS_TOKEN"
    ) in result.stderr
    assert not re.search(r"(?<!un)set MWMS_TOKEN", result.stderr) and secret not in result.output
    flagged = runner.invoke(app, ["jobs", "--api", cluster.api, "--token", secret])
    assert "from --token (it expired at" in flagged.stderr and "pass it with --token" in flagged.stderr
    assert "MWMS_TOKEN" not in flagged.stderr

    # Unknown and revoked tokens still read alike: nothing tells a guesser which secrets once existed.
    unknown = cluster.client("mwms_" + "x" * 43).get("/api/v1/jobs").json()["detail"]
    assert unknown.startswith("the token is unknown, revoked or expired")
    assert "expired_at" not in cluster.client("mwms_" + "x" * 43).get("/api/v1/jobs").json()
    with Client(cluster.api, secret) as client, pytest.raises(Unauthorized, match="expired at") as refused:
        client.agents()
    assert refused.value.expired_at is not None
    assert refused.value.expired_at.isoformat()[:19] == expires_at[:19]

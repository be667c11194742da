"""The one HTTP path to the coordinator: bearer token, TLS trust, typed errors and retries.

Retries, bounded by `retry_seconds` in total per request, with exponential backoff and jitter:
- any request whose connection could not be made (nothing was sent, so nothing can happen twice);
- replayable requests (GET/HEAD, and those the caller marks replayable: content-addressed uploads,
  submits that carry an idempotency key) also after a dropped connection or a 502/503/504 answer.
Other requests (cancel, token creation) are never resent once they may have reached the coordinator.

A mistyped address is told apart from an outage, fast: until a client has had its first answer, a refused
connection (nothing listens there) is retried for REFUSED_RETRY_S only, and an address that answers HTTP/2
only (the coordinator's gRPC port for agents) fails at once with `NotACoordinator`. The first retry of a
request says so (the `on_retry` callback, else a warning in the log), so a wait is never silent.
"""

from __future__ import annotations

import errno
import logging
import random
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

import httpx

from mwms import __version__
from mwms.errors import CoordinatorUnreachable, MwmsError, NotACoordinator, error_for_status

log = logging.getLogger("mwms.client")

RETRY_STATUSES = frozenset({502, 503, 504})
REPLAYABLE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
FIRST_BACKOFF_S = 0.2
MAX_BACKOFF_S = 2.0
# A client that never had an answer retries a refused connection this long: a coordinator starting up
# listens within it; a wrong port would otherwise be silent for the whole retry budget.
REFUSED_RETRY_S = 2.0
# Connections are made again within the retry budget, so one attempt need not wait long for a SYN's answer.
CONNECT_TIMEOUT_S = 3.0
# Reading what an address answers to HTTP/1.1, to tell an HTTP/2-only (gRPC) port from a broken server.
PROBE_TIMEOUT_S = 1.0
HTTP2_FRAME_HEADER_BYTES = 9
HTTP2_SETTINGS_FRAME = 0x04
DEFAULT_HTTP_PORT = 8080  # server/settings.py http_port
DEFAULT_GRPC_PORT = 50051  # server/settings.py grpc_port


def detail_of(response: httpx.Response) -> str:
    """The API's own explanation of an error response, as one line."""
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        return text.splitlines()[0][:300] if text else response.reason_phrase
    if not isinstance(body, dict) or "detail" not in body:
        return str(body)[:300]
    detail = body["detail"]
    if isinstance(detail, list):  # FastAPI's default validation error shape
        return "; ".join(_describe_validation_error(item) for item in detail)
    return str(detail)


def _describe_validation_error(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)
    location = ".".join(str(part) for part in item.get("loc", []) if part != "body")
    message = str(item.get("msg", item))
    return f"{location}: {message}" if location else message


def error_for_response(response: httpx.Response) -> MwmsError:
    """The typed error for an error response (its body must have been read). An HTTP 404 or 405 without the
    API's JSON comes from another server (every coordinator answer is JSON): `NotACoordinator`."""
    if response.status_code in (404, 405) and not _is_json(response):
        base = f"{response.request.url.scheme}://{response.request.url.netloc.decode()}"
        return NotACoordinator(
            f"{base} answered HTTP {response.status_code} without the API's JSON to "
            f"{response.request.url.path}: it is not an mwms coordinator (another service, or a proxy path "
            f"missing); point --api / MWMS_API at the coordinator's HTTP port (default {DEFAULT_HTTP_PORT})"
        )
    return error_for_status(response.status_code, detail_of(response), _body_of(response))


def _body_of(response: httpx.Response) -> dict[str, Any] | None:
    """The error body's JSON object, when it is one (fields besides `detail`, e.g. `expired_at`)."""
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _is_json(response: httpx.Response) -> bool:
    return response.headers.get("content-type", "").split(";")[0].strip() == "application/json"


def unreachable(error: httpx.TransportError) -> CoordinatorUnreachable:
    """The typed error for a request that never got an answer."""
    return CoordinatorUnreachable(f"{type(error).__name__}: {error}")


def was_refused(error: httpx.TransportError) -> bool:
    """True when the connection was refused: nothing listens at the address (or a firewall says so)."""
    return isinstance(error, httpx.ConnectError) and any(
        isinstance(cause, ConnectionRefusedError) or getattr(cause, "errno", None) == errno.ECONNREFUSED
        for cause in _causes(error)
    )


def refused(base_url: str, error: httpx.TransportError) -> CoordinatorUnreachable:
    """The error of a refused connection, saying what to check."""
    return CoordinatorUnreachable(
        f"nothing answers at {base_url} (connection refused): is the coordinator running? start one with "
        "`mwms server`, or check the address (--api, MWMS_API, Client(api=...))"
    )


def answers_http2_only(base_url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """True when the plain-http address answers an HTTP/1.1 request with an HTTP/2 SETTINGS frame, as a
    gRPC server (the coordinator's port for agents) does."""
    url = httpx.URL(base_url)
    if url.scheme != "http" or not url.host:
        return False
    try:
        with socket.create_connection((url.host, url.port or 80), timeout=timeout) as probe:
            probe.sendall(f"GET /healthz HTTP/1.1\r\nHost: {url.host}\r\nConnection: close\r\n\r\n".encode())
            head = b""
            while len(head) < HTTP2_FRAME_HEADER_BYTES:
                chunk = probe.recv(HTTP2_FRAME_HEADER_BYTES - len(head))
                if not chunk:
                    break
                head += chunk
    except OSError:
        return False
    # A frame header: 3 bytes of length, the type, flags, then stream 0 (the connection's own frames).
    return (
        len(head) == HTTP2_FRAME_HEADER_BYTES
        and head[3] == HTTP2_SETTINGS_FRAME
        and head[5:9] == b"\x00\x00\x00\x00"
    )


def not_the_api(base_url: str) -> NotACoordinator:
    """The error of an address that answers gRPC instead of the REST API."""
    url = httpx.URL(base_url)
    return NotACoordinator(
        f"{base_url} answers HTTP/2 only, as the coordinator's gRPC port for agents does (default "
        f"{DEFAULT_GRPC_PORT}), not its REST API: the API is on the coordinator's HTTP port (default "
        f"{DEFAULT_HTTP_PORT}); point --api / MWMS_API there, e.g. http://{url.host}:{DEFAULT_HTTP_PORT}"
    )


def _causes(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def never_recovers(error: httpx.TransportError) -> bool:
    """True for failures that waiting cannot fix: an untrusted certificate, a host name that resolves nowhere."""
    text = str(error)
    if "CERTIFICATE_VERIFY_FAILED" in text or "Name or service not known" in text:
        return True
    return any(isinstance(cause, (ssl.SSLCertVerificationError, socket.gaierror)) for cause in _causes(error))


def nothing_was_sent(error: httpx.TransportError) -> bool:
    """True when the request cannot have reached the coordinator: the connection was never made."""
    return isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout))


class Transport:
    """An httpx client for one coordinator that turns failures into `mwms.errors` and retries safely."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str = "",
        verify: ssl.SSLContext | bool = True,
        timeout: float = 30.0,
        retry_seconds: float = 30.0,
        on_retry: Callable[[str], None] | None = None,
    ) -> None:
        self.base_url = base_url
        self.retry_seconds = retry_seconds
        # Told once per request, at its first retry, what failed and for how long it will be retried.
        self.on_retry = on_retry
        # Set at the first answer of any kind: from then on a refused connection is a restart, not a typo.
        self.answered = False
        headers = {"User-Agent": f"mwms-client/{__version__}"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        limits = httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT_S))
        self._http = httpx.Client(base_url=base_url, headers=headers, verify=verify, timeout=limits)

    def close(self) -> None:
        """Closes the pooled connections."""
        self._http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        replayable: bool | None = None,
        rewind: IO[bytes] | None = None,
        retry_seconds: float | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """Sends one request (again, as the module docstring allows) and returns its 2xx response.

        `replayable` defaults to True for GET/HEAD/OPTIONS; `rewind` is a request body file to seek
        back to 0 before a resend.
        """
        replay = method.upper() in REPLAYABLE_METHODS if replayable is None else replayable
        retrying = self._retrying(retry_seconds, method, path)
        while True:
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as error:
                self._raise_if_mistaken(error, retrying)
                resendable = (replay or nothing_was_sent(error)) and not never_recovers(error)
                if not resendable or not retrying.another(str(error)):
                    raise self._unreachable(error) from error
            else:
                self.answered = True
                if not (replay and response.status_code in RETRY_STATUSES):
                    if response.is_error:
                        raise error_for_response(response)
                    return response
                if not retrying.another(f"HTTP {response.status_code}"):
                    raise error_for_response(response)
            if rewind is not None:
                rewind.seek(0)

    @contextmanager
    def stream(self, method: str, path: str, **kwargs: Any) -> Iterator[httpx.Response]:
        """A streamed 2xx response (GET: opening it is retried like `request`); the body is read lazily.

        A failure while reading the body raises `CoordinatorUnreachable`; the caller decides whether to
        start again (e.g. from a cursor).
        """
        retrying = self._retrying(None, method, path)
        while True:
            try:
                with self._http.stream(method, path, **kwargs) as response:
                    self.answered = True
                    if response.status_code in RETRY_STATUSES and retrying.another(
                        f"HTTP {response.status_code}"
                    ):
                        continue
                    if response.is_error:
                        response.read()
                        raise error_for_response(response)
                    try:
                        yield response
                    except httpx.TransportError as error:
                        raise unreachable(error) from error
                    return
            except httpx.TransportError as error:
                self._raise_if_mistaken(error, retrying)
                if never_recovers(error) or not retrying.another(str(error)):
                    raise self._unreachable(error) from error

    def _retrying(self, budget_s: float | None, method: str, path: str) -> _Retrying:
        budget = self.retry_seconds if budget_s is None else budget_s
        return _Retrying(budget, method, path, self.base_url, self.on_retry)

    def _raise_if_mistaken(self, error: httpx.TransportError, retrying: _Retrying) -> None:
        """Before the first answer: fails at once on a gRPC port, and shortens the retries of a refusal."""
        if self.answered:
            return
        if isinstance(error, httpx.RemoteProtocolError) and answers_http2_only(self.base_url):
            raise not_the_api(self.base_url) from error
        if was_refused(error):
            retrying.shorten(REFUSED_RETRY_S)

    def _unreachable(self, error: httpx.TransportError) -> CoordinatorUnreachable:
        if not self.answered and was_refused(error):
            return refused(self.base_url, error)
        return unreachable(error)


class _Retrying:
    """Backoff bookkeeping for one request: `another()` sleeps and says yes while time is left."""

    def __init__(
        self,
        budget_s: float,
        method: str,
        path: str,
        base_url: str = "",
        on_retry: Callable[[str], None] | None = None,
    ) -> None:
        self._started = time.monotonic()
        self._deadline = self._started + budget_s
        self._delay = FIRST_BACKOFF_S
        self._what = f"{method} {path}"
        self._base_url = base_url
        self._on_retry = on_retry
        self._shortened = False
        self.count = 0

    def shorten(self, budget_s: float) -> None:
        """Retries for at most `budget_s` from the start (a refused connection before any answer)."""
        self._shortened = True
        self._deadline = min(self._deadline, self._started + budget_s)

    def another(self, why: str) -> bool:
        """Waits the next backoff and returns True, or returns False when that would pass the deadline."""
        pause = self._delay * random.uniform(0.75, 1.25)
        if time.monotonic() + pause > self._deadline:
            return False
        if self.count == 0 and not self._shortened:
            left = max(0.0, self._deadline - time.monotonic())
            where = self._base_url or "the coordinator"
            notice = f"cannot get an answer from {where} ({why}); retrying for up to {left:.0f} s"
            if self._on_retry is not None:
                self._on_retry(notice)
            else:
                log.warning("%s", notice)
        self.count += 1
        log.info("%s failed (%s); retry %d in %.1f s", self._what, why, self.count, pause)
        time.sleep(pause)
        self._delay = min(self._delay * 2, MAX_BACKOFF_S)
        return True

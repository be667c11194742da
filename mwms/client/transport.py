"""The one HTTP path to the coordinator: bearer token, TLS trust, typed errors and retries.

Retries, bounded by `retry_seconds` in total per request, with exponential backoff and jitter:
- any request whose connection could not be made (nothing was sent, so nothing can happen twice);
- replayable requests (GET/HEAD, and those the caller marks replayable: content-addressed uploads,
  submits that carry an idempotency key) also after a dropped connection or a 502/503/504 answer.
Other requests (cancel, token creation) are never resent once they may have reached the coordinator.
"""

from __future__ import annotations

import logging
import random
import socket
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import httpx

from mwms import __version__
from mwms.errors import CoordinatorUnreachable, MwmsError, error_for_status

log = logging.getLogger("mwms.client")

RETRY_STATUSES = frozenset({502, 503, 504})
REPLAYABLE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
FIRST_BACKOFF_S = 0.2
MAX_BACKOFF_S = 2.0


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
    """The typed error for an error response (its body must have been read)."""
    return error_for_status(response.status_code, detail_of(response))


def unreachable(error: httpx.TransportError) -> CoordinatorUnreachable:
    """The typed error for a request that never got an answer."""
    return CoordinatorUnreachable(f"{type(error).__name__}: {error}")


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
    ) -> None:
        self.base_url = base_url
        self.retry_seconds = retry_seconds
        headers = {"User-Agent": f"mwms-client/{__version__}"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=base_url, headers=headers, verify=verify, timeout=timeout)

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
        retrying = _Retrying(self.retry_seconds if retry_seconds is None else retry_seconds, method, path)
        while True:
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as error:
                resendable = (replay or nothing_was_sent(error)) and not never_recovers(error)
                if not resendable or not retrying.another(str(error)):
                    raise unreachable(error) from error
            else:
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
        retrying = _Retrying(self.retry_seconds, method, path)
        while True:
            try:
                with self._http.stream(method, path, **kwargs) as response:
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
                if never_recovers(error) or not retrying.another(str(error)):
                    raise unreachable(error) from error


class _Retrying:
    """Backoff bookkeeping for one request: `another()` sleeps and says yes while time is left."""

    def __init__(self, budget_s: float, method: str, path: str) -> None:
        self._deadline = time.monotonic() + budget_s
        self._delay = FIRST_BACKOFF_S
        self._what = f"{method} {path}"
        self.count = 0

    def another(self, why: str) -> bool:
        """Waits the next backoff and returns True, or returns False when that would pass the deadline."""
        pause = self._delay * random.uniform(0.75, 1.25)
        if time.monotonic() + pause > self._deadline:
            return False
        self.count += 1
        log.info("%s failed (%s); retry %d in %.1f s", self._what, why, self.count, pause)
        time.sleep(pause)
        self._delay = min(self._delay * 2, MAX_BACKOFF_S)
        return True

"""A small synchronous client for the coordinator's REST API; every failure is one `ApiError`."""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import httpx

from mwms.cli.connection import DEFAULT_API, Connection, normalize_api, resolve_connection

API_PREFIX = "/api/v1"


class ApiError(Exception):
    """The API answered with an error status, or could not be reached (`status` is None then)."""

    def __init__(self, status: int | None, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail

    @property
    def unreachable(self) -> bool:
        return self.status is None


def _detail_from(response: httpx.Response) -> str:
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


class _ProgressReader:
    """Wraps a binary file so that each read reports how many bytes went out."""

    def __init__(self, file: IO[bytes], on_bytes: Callable[[int], None]) -> None:
        self._file = file
        self._on_bytes = on_bytes

    def read(self, size: int = -1) -> bytes:
        chunk = self._file.read(size)
        self._on_bytes(len(chunk))
        return chunk

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def fileno(self) -> int:
        # Lets httpx learn the length and send Content-Length instead of a chunked body.
        return self._file.fileno()


class ApiClient:
    """Calls the coordinator at `base_url` with `token` as bearer; methods return the API's JSON unchanged."""

    def __init__(
        self,
        base_url: str = DEFAULT_API,
        *,
        token: str = "",
        verify: ssl.SSLContext | bool = True,
        timeout: float = 30.0,
    ) -> None:
        self.base_url = normalize_api(base_url)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, verify=verify, timeout=timeout)

    @classmethod
    def for_connection(cls, connection: Connection, *, timeout: float = 30.0) -> ApiClient:
        """A client for a resolved connection (see `connect`)."""
        return cls(connection.api, token=connection.token, verify=connection.verify(), timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- plumbing --------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as error:
            raise ApiError(None, f"{type(error).__name__}: {error}") from error
        if response.is_error:
            raise ApiError(response.status_code, _detail_from(response))
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._request(method, path, **kwargs)
        try:
            return response.json()
        except ValueError as error:
            raise ApiError(
                response.status_code, f"expected JSON from {path}, got {response.text[:100]!r}"
            ) from error

    @staticmethod
    def _params(**values: Any) -> dict[str, Any]:
        return {key: value for key, value in values.items() if value is not None}

    def _delete(self, path: str) -> Any:
        """DELETE, returning the JSON body, or {} when the API answers without one."""
        response = self._request("DELETE", path)
        return response.json() if response.content else {}

    # -- endpoints -------------------------------------------------------------------------------------

    def health(self) -> bool:
        """True when /healthz answers 2xx."""
        try:
            self._request("GET", "/healthz", timeout=2.0)
        except ApiError:
            return False
        return True

    def upload_bundle(
        self, file: IO[bytes], *, on_bytes: Callable[[int], None] | None = None
    ) -> dict[str, Any]:
        """Uploads a .tar.gz bundle; returns {"digest", "size", "format", "created"}."""
        body: Any = _ProgressReader(file, on_bytes) if on_bytes else file
        files = {"file": ("bundle.tar.gz", body, "application/gzip")}
        # Large bundles over slow links: allow the body as long as it needs.
        return self._json(
            "POST", f"{API_PREFIX}/bundles", files=files, timeout=httpx.Timeout(30.0, write=None)
        )

    def create_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._json("POST", f"{API_PREFIX}/jobs", json=spec)

    def list_jobs(
        self, states: list[str] | None = None, *, offset: int = 0, limit: int = 50
    ) -> dict[str, Any]:
        params: list[tuple[str, Any]] = [("state", state) for state in states or []]
        params += [("offset", offset), ("limit", limit)]
        return self._json("GET", f"{API_PREFIX}/jobs", params=params)

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self._json("GET", f"{API_PREFIX}/jobs/{job_id}")

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        return self._json("POST", f"{API_PREFIX}/jobs/{job_id}/cancel")

    def list_agents(self) -> list[dict[str, Any]]:
        return self._json("GET", f"{API_PREFIX}/agents")

    def logs(
        self,
        job_id: str,
        *,
        task: int | None = None,
        attempt: int | None = None,
        tail: int | None = None,
        after: int | None = None,
    ) -> dict[str, Any]:
        """One page of log lines: {"lines": [...], "next_after"}."""
        params = self._params(task=task, attempt=attempt, tail=tail, after=after)
        return self._json("GET", f"{API_PREFIX}/jobs/{job_id}/logs", params=params)

    def follow_logs(
        self,
        job_id: str,
        *,
        task: int | None = None,
        attempt: int | None = None,
        tail: int | None = None,
        after: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Yields log line objects from the streaming endpoint until the job is finished."""
        params = self._params(task=task, attempt=attempt, tail=tail, after=after)
        params["follow"] = "true"
        url = f"{API_PREFIX}/jobs/{job_id}/logs"
        try:
            with self._http.stream(
                "GET", url, params=params, timeout=httpx.Timeout(30.0, read=None)
            ) as response:
                if response.is_error:
                    response.read()
                    raise ApiError(response.status_code, _detail_from(response))
                for raw in response.iter_lines():
                    if raw.strip():
                        yield json.loads(raw)
        except httpx.TransportError as error:
            raise ApiError(None, f"{type(error).__name__}: {error}") from error

    def metrics(
        self,
        job_id: str,
        *,
        name: str | None = None,
        min_step: int | None = None,
        max_step: int | None = None,
        attempt: int | None = None,
    ) -> dict[str, Any]:
        params = self._params(name=name, min_step=min_step, max_step=max_step, attempt=attempt)
        return self._json("GET", f"{API_PREFIX}/jobs/{job_id}/metrics", params=params)

    def list_artifacts(self, job_id: str) -> list[dict[str, Any]]:
        return self._json("GET", f"{API_PREFIX}/jobs/{job_id}/artifacts")

    def download_artifact(self, job_id: str, path: str, destination: Path) -> int:
        """Streams one artifact into `destination` (written via a temp file); returns the byte count."""
        partial = destination.with_name(destination.name + ".part")
        url = f"{API_PREFIX}/jobs/{job_id}/artifacts/{quote(path)}"
        written = 0
        try:
            with self._http.stream("GET", url, timeout=httpx.Timeout(30.0, read=300.0)) as response:
                if response.is_error:
                    response.read()
                    raise ApiError(response.status_code, _detail_from(response))
                with partial.open("wb") as out:
                    for chunk in response.iter_bytes():
                        out.write(chunk)
                        written += len(chunk)
        except httpx.TransportError as error:
            partial.unlink(missing_ok=True)
            raise ApiError(None, f"{type(error).__name__}: {error}") from error
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        partial.replace(destination)
        return written

    # -- identity and tokens (admin) ----------------------------------------------------------------------

    def whoami(self) -> dict[str, Any]:
        """{"user", "role", "token_name", "via_session"} of the token this client sends."""
        return self._json("GET", f"{API_PREFIX}/whoami")

    def list_tokens(self) -> list[dict[str, Any]]:
        return self._json("GET", f"{API_PREFIX}/tokens")

    def create_token(
        self, user: str, role: str, name: str = "", expires_in_seconds: int | None = None
    ) -> dict[str, Any]:
        """A new API token; the response's "token" is its secret, returned this once."""
        body = {"user": user, "role": role, "name": name, "expires_in_seconds": expires_in_seconds}
        return self._json("POST", f"{API_PREFIX}/tokens", json=body)

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        return self._json("DELETE", f"{API_PREFIX}/tokens/{quote(token_id, safe='')}")

    def list_join_tokens(self) -> list[dict[str, Any]]:
        return self._json("GET", f"{API_PREFIX}/agent-tokens")

    def create_join_token(
        self, name: str = "agents", expires_in_seconds: int | None = None
    ) -> dict[str, Any]:
        """A new join token for agents; the response's "token" is its secret, returned this once."""
        body = {"name": name, "expires_in_seconds": expires_in_seconds}
        return self._json("POST", f"{API_PREFIX}/agent-tokens", json=body)

    def revoke_join_token(self, token_id: str) -> dict[str, Any]:
        return self._json("DELETE", f"{API_PREFIX}/agent-tokens/{quote(token_id, safe='')}")

    def remove_agent(self, agent_id: str) -> Any:
        """Removes an agent: its credential is revoked and its tasks are stopped."""
        return self._delete(f"{API_PREFIX}/agents/{quote(agent_id, safe='')}")


def connect(
    api: str | None = None,
    token: str | None = None,
    ca_file: str | Path | None = None,
    *,
    timeout: float = 30.0,
) -> ApiClient:
    """A client for the coordinator that --api / MWMS_API / `mwms login` name, with the token in force."""
    return ApiClient.for_connection(resolve_connection(api, token, ca_file), timeout=timeout)

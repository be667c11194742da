"""The coordinator's REST endpoints, one method each, returning the API's JSON unchanged.

`mwms.Client` builds its typed objects on these; the CLI prints them (`--json`) as they are.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import httpx

from mwms.client.transport import Transport
from mwms.errors import MwmsError

API_PREFIX = "/api/v1"
IDEMPOTENCY_HEADER = "Idempotency-Key"


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


def _params(**values: Any) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


class RestApi:
    """One method per endpoint; every call goes through the client's `Transport`."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.transport.request(method, path, **kwargs)
        if not response.content and method == "DELETE":
            return {}
        try:
            return response.json()
        except ValueError as error:
            raise MwmsError(
                f"expected JSON from {path}, got {response.text[:100]!r}", response.status_code
            ) from error

    # -- health, bundles, jobs --------------------------------------------------------------------------

    def health(self, timeout: float = 2.0) -> bool:
        """True when /healthz answers 2xx (asked once, without retries)."""
        try:
            self.transport.request("GET", "/healthz", timeout=timeout, retry_seconds=0)
        except MwmsError:
            return False
        return True

    def upload_bundle(
        self, file: IO[bytes], *, on_bytes: Callable[[int], None] | None = None
    ) -> dict[str, Any]:
        """Uploads a .tar.gz bundle; returns {"digest", "size", "format", "created"}.

        Bundles are stored by content digest, so a resent upload is harmless: it is retried.
        """
        body: Any = _ProgressReader(file, on_bytes) if on_bytes else file
        files = {"file": ("bundle.tar.gz", body, "application/gzip")}
        # Large bundles over slow links: allow the body as long as it needs.
        return self._json(
            "POST",
            f"{API_PREFIX}/bundles",
            files=files,
            timeout=httpx.Timeout(30.0, write=None),
            replayable=True,
            rewind=file,
        )

    def create_job(self, spec: dict[str, Any], *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Creates a job; with an idempotency key the request is resent after a failure, and the
        coordinator answers every resend with the job the first one created."""
        headers = {IDEMPOTENCY_HEADER: idempotency_key} if idempotency_key else {}
        return self._json(
            "POST", f"{API_PREFIX}/jobs", json=spec, headers=headers, replayable=bool(idempotency_key)
        )

    def list_jobs(
        self, states: list[str] | None = None, *, offset: int = 0, limit: int = 50
    ) -> dict[str, Any]:
        """{"jobs": [...], "total", "offset", "limit"}, newest first."""
        params: list[tuple[str, Any]] = [("state", state) for state in states or []]
        params += [("offset", offset), ("limit", limit)]
        return self._json("GET", f"{API_PREFIX}/jobs", params=params)

    def get_job(self, job_id: str) -> dict[str, Any]:
        """A job with its tasks, attempts and state changes."""
        return self._json("GET", f"{API_PREFIX}/jobs/{quote(job_id, safe='')}")

    def job_preflight(self, job_id: str) -> dict[str, Any]:
        """{"job_id", "attempts": [{"attempt", "ok", "results": [...]}]}: the job's preflight results."""
        return self._json("GET", f"{API_PREFIX}/jobs/{quote(job_id, safe='')}/preflight")

    def dump_stacks(self, job_id: str) -> dict[str, Any]:
        """Takes the Python stacks of the job's running tasks now (never resent: each call takes a new
        dump); the coordinator waits up to 10 s for its agents. Returns the dump."""
        return self._json("POST", f"{API_PREFIX}/jobs/{quote(job_id, safe='')}/stacks", replayable=False)

    def job_stacks(self, job_id: str, request_id: str | None = None) -> dict[str, Any]:
        """The job's newest stack dump, or the one named by `request_id`."""
        params = _params(request=request_id)
        return self._json("GET", f"{API_PREFIX}/jobs/{quote(job_id, safe='')}/stacks", params=params)

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        """Cancels a job (never resent: a second cancel would be a 409); returns the job."""
        return self._json("POST", f"{API_PREFIX}/jobs/{quote(job_id, safe='')}/cancel")

    def list_agents(self) -> list[dict[str, Any]]:
        """Every agent the coordinator knows, online or not."""
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
        params = _params(task=task, attempt=attempt, tail=tail, after=after)
        return self._json("GET", f"{API_PREFIX}/jobs/{quote(job_id, safe='')}/logs", params=params)

    def follow_logs(
        self,
        job_id: str,
        *,
        task: int | None = None,
        attempt: int | None = None,
        tail: int | None = None,
        after: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Yields log line objects from the streaming endpoint until the job has finished.

        The stream ends with `CoordinatorUnreachable` if the connection drops; resume with `after`.
        """
        params = _params(task=task, attempt=attempt, tail=tail, after=after)
        params["follow"] = "true"
        url = f"{API_PREFIX}/jobs/{quote(job_id, safe='')}/logs"
        with self.transport.stream(
            "GET", url, params=params, timeout=httpx.Timeout(30.0, read=None)
        ) as response:
            for raw in response.iter_lines():
                if raw.strip():
                    yield json.loads(raw)

    def metrics(
        self,
        job_id: str,
        *,
        name: str | None = None,
        min_step: int | None = None,
        max_step: int | None = None,
        attempt: int | None = None,
        after: int | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """One page: {"points": [{"name", "step", "value", "wall_time", "attempt"}, ...], "cursor", "more"}."""
        params = _params(
            name=name, min_step=min_step, max_step=max_step, attempt=attempt, after=after, limit=limit
        )
        return self._json("GET", f"{API_PREFIX}/jobs/{quote(job_id, safe='')}/metrics", params=params)

    def all_metrics(
        self,
        job_id: str,
        *,
        name: str | None = None,
        min_step: int | None = None,
        max_step: int | None = None,
        attempt: int | None = None,
    ) -> list[dict[str, Any]]:
        """Every matching point, read page by page (after a cursor, in storage order), ordered by name,
        attempt and step."""
        points: list[dict[str, Any]] = []
        cursor, more = 0, True
        while more:
            page = self.metrics(
                job_id, name=name, min_step=min_step, max_step=max_step, attempt=attempt, after=cursor
            )
            points += page.get("points") or []
            following = int(page.get("cursor") or 0)
            more = bool(page.get("more")) and following > cursor  # a cursor that does not move ends it
            cursor = following
        return sorted(points, key=lambda point: (point["name"], point["attempt"], point["step"]))

    def list_artifacts(self, job_id: str) -> list[dict[str, Any]]:
        """[{"path", "size", "sha256", "attempt", "created_at"}, ...] of a job."""
        return self._json("GET", f"{API_PREFIX}/jobs/{quote(job_id, safe='')}/artifacts")

    def download_artifact(self, job_id: str, path: str, destination: Path) -> int:
        """Streams one artifact into `destination` (written via a temp file); returns the byte count."""
        partial = destination.with_name(destination.name + ".part")
        url = f"{API_PREFIX}/jobs/{quote(job_id, safe='')}/artifacts/{quote(path)}"
        written = 0
        try:
            with self.transport.stream("GET", url, timeout=httpx.Timeout(30.0, read=300.0)) as response:
                with partial.open("wb") as out:
                    for chunk in response.iter_bytes():
                        out.write(chunk)
                        written += len(chunk)
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
        """API tokens (never their secrets), revoked and expired ones included."""
        return self._json("GET", f"{API_PREFIX}/tokens")

    def create_token(
        self, user: str, role: str, name: str = "", expires_in_seconds: int | None = None
    ) -> dict[str, Any]:
        """A new API token; the response's "token" is its secret, returned this once."""
        body = {"user": user, "role": role, "name": name, "expires_in_seconds": expires_in_seconds}
        return self._json("POST", f"{API_PREFIX}/tokens", json=body)

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        """Revokes an API token; returns it."""
        return self._json("DELETE", f"{API_PREFIX}/tokens/{quote(token_id, safe='')}")

    def list_join_tokens(self) -> list[dict[str, Any]]:
        """Join tokens for agents (never their secrets)."""
        return self._json("GET", f"{API_PREFIX}/agent-tokens")

    def create_join_token(
        self, name: str = "agents", expires_in_seconds: int | None = None
    ) -> dict[str, Any]:
        """A new join token for agents; the response's "token" is its secret, returned this once."""
        body = {"name": name, "expires_in_seconds": expires_in_seconds}
        return self._json("POST", f"{API_PREFIX}/agent-tokens", json=body)

    def revoke_join_token(self, token_id: str) -> dict[str, Any]:
        """Revokes a join token; returns it."""
        return self._json("DELETE", f"{API_PREFIX}/agent-tokens/{quote(token_id, safe='')}")

    def remove_agent(self, agent_id: str) -> Any:
        """Removes an agent: its credential is revoked and its tasks are stopped."""
        return self._json("DELETE", f"{API_PREFIX}/agents/{quote(agent_id, safe='')}")

    # -- sharing the cluster: priorities, the queue, teams and quotas, cordons and drains ------------------

    def set_priority(self, job_id: str, priority: int | str) -> dict[str, Any]:
        """Changes a pending job's priority (0-1000, or "low", "normal", "high"); returns the job."""
        body = {"priority": priority}
        return self._json(
            "POST", f"{API_PREFIX}/jobs/{quote(job_id, safe='')}/priority", json=body, replayable=True
        )

    def queue(self, *, offset: int = 0, limit: int = 100) -> dict[str, Any]:
        """{"jobs": [...], "total", "offset", "limit"}: the waiting jobs in the scheduler's order."""
        return self._json("GET", f"{API_PREFIX}/queue", params={"offset": offset, "limit": limit})

    def list_teams(self) -> list[dict[str, Any]]:
        """[{"team", "members", "quota", "in_use", "usage_device_hours", "share", "standing"}, ...]: every team
        with members, a quota, devices in use or recent use."""
        return self._json("GET", f"{API_PREFIX}/teams")

    def add_team_member(self, team: str, user: str) -> dict[str, Any]:
        """Puts `user` in `team` (admin); returns the team."""
        path = f"{API_PREFIX}/teams/{quote(team, safe='')}/members/{quote(user, safe='')}"
        return self._json("PUT", path, replayable=True)

    def remove_team_member(self, team: str, user: str) -> dict[str, Any]:
        """Takes `user` out of `team` (admin); returns the team."""
        path = f"{API_PREFIX}/teams/{quote(team, safe='')}/members/{quote(user, safe='')}"
        return self._json("DELETE", path)

    def set_quota(self, team: str, gpus: int | None, cpu_slots: int | None) -> dict[str, Any]:
        """Sets (replaces) a team's quota (admin); None for a kind: no cap. Returns the team."""
        body = {"gpus": gpus, "cpu_slots": cpu_slots}
        path = f"{API_PREFIX}/teams/{quote(team, safe='')}/quota"
        return self._json("PUT", path, json=body, replayable=True)

    def clear_quota(self, team: str) -> dict[str, Any]:
        """Removes a team's quota (admin); returns the team."""
        return self._json("DELETE", f"{API_PREFIX}/teams/{quote(team, safe='')}/quota")

    def cordon_agent(self, agent: str, reason: str = "") -> dict[str, Any]:
        """Cordons an agent (admin): nothing new is placed on it. Returns the agent."""
        path = f"{API_PREFIX}/agents/{quote(agent, safe='')}/cordon"
        return self._json("POST", path, json={"reason": reason}, replayable=True)

    def uncordon_agent(self, agent: str) -> dict[str, Any]:
        """Ends an agent's cordon or drain (admin). Returns the agent."""
        return self._json("POST", f"{API_PREFIX}/agents/{quote(agent, safe='')}/uncordon")

    def drain_agent(
        self, agent: str, reason: str = "", grace_seconds: int | None = None, let_finish: bool = False
    ) -> dict[str, Any]:
        """Drains an agent (admin): cordons it and preempts its jobs (unless `let_finish`). Returns it."""
        body = {"reason": reason, "grace_seconds": grace_seconds, "let_finish": let_finish}
        return self._json("POST", f"{API_PREFIX}/agents/{quote(agent, safe='')}/drain", json=body)

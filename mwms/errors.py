"""The errors `mwms.Client` (and the CLI built on it) raise: one base, one class per kind of failure.

Standard library only, so `import mwms.errors` costs nothing. Every error carries `detail`, the
coordinator's own message when it answered (else ours), and `status`, its HTTP status (None when the
coordinator was not reached or the failure happened on this side).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any


class MwmsError(Exception):
    """Base of every error the client raises."""

    def __init__(self, detail: str, status: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status


class ConfigError(MwmsError):
    """The config file or the CA file cannot be used; the message says why and what to do."""


class CoordinatorUnreachable(MwmsError):
    """The coordinator could not be reached, or a proxy in front of it answered 502/503/504, for longer
    than the client retries."""


class NotACoordinator(CoordinatorUnreachable):
    """Something answers at the address, but not the coordinator's REST API (e.g. its gRPC port for agents);
    waiting will not help, so it is raised at once."""


class ServerError(MwmsError):
    """The coordinator answered with an internal error (HTTP 500 and other 5xx)."""


class NotFound(MwmsError):
    """No such job, artifact, agent or token (HTTP 404)."""


class Unauthorized(MwmsError):
    """No token, or one the coordinator refuses (HTTP 401); `Forbidden` for a role that may not (403).
    `expired_at`: when the coordinator says the token expired (its 401's `expired_at`), else None."""

    expired_at: datetime | None = None


class Forbidden(Unauthorized):
    """The token is valid but its role (or ownership) does not allow the request (HTTP 403)."""


class InvalidSpec(MwmsError):
    """The request cannot be carried out as given: a bad job spec (HTTP 400/422) or program directory."""


class Conflict(MwmsError):
    """The request contradicts the current state (HTTP 409): cancelling a finished job, or reusing an
    idempotency key for a different job spec."""


class WaitTimeout(MwmsError, TimeoutError):
    """`Job.wait(timeout=...)` ran out of time; the job keeps running."""


class JobFailed(MwmsError):
    """The job ended FAILED: `reason` says why, `log_lines` are the end of the failing task's log."""

    def __init__(
        self,
        job_id: str,
        reason: str,
        *,
        state: str = "FAILED",
        task: int | None = None,
        log_lines: list[str] | None = None,
    ) -> None:
        self.job_id = job_id
        self.reason = reason
        self.state = state
        self.task = task
        self.log_lines = list(log_lines or [])
        message = f"job {job_id} ended {state}: {reason or 'no reason recorded'}"
        if self.log_lines and task is not None:
            tail = "\n".join(f"  {line}" for line in self.log_lines)
            message += f"\nlast {len(self.log_lines)} log lines of task {task}:\n{tail}"
        super().__init__(message)


ERROR_FOR_STATUS: dict[int, type[MwmsError]] = {
    400: InvalidSpec,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: InvalidSpec,
    502: CoordinatorUnreachable,
    503: CoordinatorUnreachable,
    504: CoordinatorUnreachable,
}


def error_for_status(status: int, detail: str, body: Mapping[str, Any] | None = None) -> MwmsError:
    """The typed error for an HTTP error status, the API's message and the rest of its error body."""
    kind = ERROR_FOR_STATUS.get(status) or (ServerError if status >= 500 else MwmsError)
    error = kind(detail, status)
    expired_at = (body or {}).get("expired_at")
    if isinstance(error, Unauthorized) and isinstance(expired_at, str):
        try:
            error.expired_at = datetime.fromisoformat(expired_at)
        except ValueError:
            pass  # not a time: the message still says it
    return error


__all__ = [
    "MwmsError",
    "ConfigError",
    "CoordinatorUnreachable",
    "ServerError",
    "NotFound",
    "Unauthorized",
    "Forbidden",
    "InvalidSpec",
    "Conflict",
    "WaitTimeout",
    "JobFailed",
    "error_for_status",
]

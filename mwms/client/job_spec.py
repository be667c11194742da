"""The job spec (`POST /api/v1/jobs`'s body) from submit's options: the one builder `mwms submit`, `mwms
quickstart` and `Client.submit` share, so an option means the same wherever it is given."""

from __future__ import annotations

from typing import Any


def _without_none(values: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def build_job_spec(
    *,
    name: str,
    bundle_digest: str,
    command: list[str],
    workers: int,
    gpus_per_worker: int | None = None,
    memory_per_worker: int | None = None,
    cpus_per_worker: float | None = None,
    env: dict[str, str] | None = None,
    communication: str | None = None,
    collective_timeout: float | None = None,
    bytes_per_pack: int | None = None,
    max_restarts: int | None = None,
    restart_on: str | None = None,
    fail_on_nan: list[str] | None = None,
    startup_timeout: float | None = None,
    max_runtime: float | None = None,
    hang_timeout: float | None = None,
    preflight: bool | None = None,
    agents: list[str] | None = None,
    priority: int | str | None = None,
    preemptible: bool | None = None,
    preemption_grace: int | None = None,
    environment: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `POST /api/v1/jobs` body, leaving out what was not set so the coordinator's defaults apply."""
    spec: dict[str, Any] = {
        "name": name,
        "bundle_digest": bundle_digest,
        "command": command,
        "workers": workers,
        "env": env or None,
        "communication": _without_none(
            {
                "implementation": communication,
                "timeout_seconds": collective_timeout,
                "bytes_per_pack": bytes_per_pack,
            }
        )
        or None,
        "restart": _without_none(
            {"max_restarts": max_restarts, "restart_on": restart_on, "fail_on_nan": fail_on_nan or None}
        )
        or None,
        "agents": agents or None,
        "gpus_per_worker": gpus_per_worker,
        "memory_per_worker": memory_per_worker,
        "cpus_per_worker": cpus_per_worker,
        "startup_timeout_seconds": startup_timeout,
        "max_runtime_seconds": max_runtime,
        "hang_timeout_seconds": hang_timeout,
        "preflight": preflight,
        "priority": priority,
        "preemptible": preemptible,
        "preemption_grace_seconds": preemption_grace,
        "environment": environment,
    }
    return _without_none(spec)

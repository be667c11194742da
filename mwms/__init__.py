"""mwms: a control plane for tf.distribute.MultiWorkerMirroredStrategy.

This package holds the Python client (`from mwms import Client`), the command-line interface, the
generated protocol modules (mwms.v1) and the small pieces both the coordinator and the agent share.
Importing it stays cheap: the client (and httpx) load on first use of one of its names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from mwms.client import Agent, Artifact, Client, Job, LogLine, MetricPoint, Metrics
    from mwms.errors import (
        Conflict,
        CoordinatorUnreachable,
        Forbidden,
        InvalidSpec,
        JobFailed,
        MwmsError,
        NotFound,
        ServerError,
        Unauthorized,
        WaitTimeout,
    )

_CLIENT_NAMES = frozenset({"Client", "Job", "Agent", "Artifact", "LogLine", "MetricPoint", "Metrics"})
_ERROR_NAMES = frozenset(
    {
        "MwmsError",
        "CoordinatorUnreachable",
        "ServerError",
        "NotFound",
        "Unauthorized",
        "Forbidden",
        "InvalidSpec",
        "Conflict",
        "JobFailed",
        "WaitTimeout",
    }
)

__all__ = [
    "__version__",
    "Client",
    "Job",
    "Agent",
    "Artifact",
    "LogLine",
    "MetricPoint",
    "Metrics",
    "MwmsError",
    "CoordinatorUnreachable",
    "ServerError",
    "NotFound",
    "Unauthorized",
    "Forbidden",
    "InvalidSpec",
    "Conflict",
    "JobFailed",
    "WaitTimeout",
]


def __getattr__(name: str) -> Any:
    # Lazy, so that the coordinator, the agent and training programs importing mwms.* do not load httpx.
    if name in _CLIENT_NAMES:
        import mwms.client

        return getattr(mwms.client, name)
    if name in _ERROR_NAMES:
        import mwms.errors

        return getattr(mwms.errors, name)
    raise AttributeError(f"module 'mwms' has no attribute {name!r}")

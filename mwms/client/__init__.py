"""The Python client of the mwms coordinator: `Client`, `Job`, and the typed objects they return.

`from mwms import Client` is the short way in; errors live in `mwms.errors` (also exported by `mwms`).
"""

from mwms.client.admin import Identity, Token
from mwms.client.client import Client
from mwms.client.diagnostics import Preflight, StackDump
from mwms.client.job import Job
from mwms.client.models import Agent, Artifact, LogLine, MetricPoint, Metrics, QueueEntry, Team
from mwms.client.pages import JobPage, LogPage, QueuePage

__all__ = [
    "Client",
    "Job",
    "Agent",
    "Artifact",
    "Identity",
    "JobPage",
    "LogLine",
    "LogPage",
    "MetricPoint",
    "Metrics",
    "Preflight",
    "QueueEntry",
    "QueuePage",
    "StackDump",
    "Team",
    "Token",
]

"""Pydantic request and response models: the REST API's contract (rendered at /docs).

One module per resource or concern; every name is re-exported here, so `from mwms.server.schemas import X`
works whichever module defines X. The modules import only common.py and job_parts.py of their siblings:

- common.py: what several share (SETTING_LIMIT, GraceSeconds, the GPU UUID descriptions)
- job_parts.py: the parts of a job's spec (field types, communication, restart, priority, environment)
- jobs.py: JobCreate, PriorityChange
- job_views.py: JobOut, JobSummary, JobPage, tasks, attempts and their endings
- telemetry.py: log lines, metric series, device telemetry
- diagnostics.py: preflight results, stack dumps
- agents.py: agents, their devices and tasks, the cluster overview
- files.py: bundles, artifacts
- errors.py: error bodies
- auth.py: tokens, login, who am I
- sharing.py: the queue, teams and quotas, cordons and drains
- replicas.py: the coordinator replicas
"""

from __future__ import annotations

from mwms.server.schemas.agents import (
    AgentOut,
    AgentTaskOut,
    DeviceOut,
    Overview,
    WarmPoolOut,
)
from mwms.server.schemas.auth import (
    MAX_TOKEN_LIFETIME_S,
    MAX_TOKEN_NAME_CHARS,
    JoinTokenCreate,
    Lifetime,
    LoginRequest,
    RoleName,
    TokenCreate,
    TokenCreated,
    TokenOut,
    WhoAmI,
)
from mwms.server.schemas.common import (
    DEVICE_UUID_DESCRIPTION,
    DEVICE_UUIDS_DESCRIPTION,
    MAX_GRACE_SECONDS,
    SETTING_LIMIT,
    GraceSeconds,
)
from mwms.server.schemas.diagnostics import (
    PreflightAttemptOut,
    PreflightOut,
    PreflightResultOut,
    StackDumpsOut,
    StackThreadOut,
    TaskStacksOut,
)
from mwms.server.schemas.errors import (
    ErrorOut,
    ValidationErrorOut,
    ValidationIssue,
)
from mwms.server.schemas.files import (
    ArtifactOut,
    BundleOut,
)
from mwms.server.schemas.job_parts import (
    PRIORITY_HELP,
    PRIORITY_NAME_PATTERN,
    TIMEOUT_HELP,
    CommunicationImplementation,
    CommunicationOptions,
    CpusPerWorker,
    EnvironmentIn,
    EnvironmentOut,
    HangTimeout,
    MemoryPerWorker,
    Name,
    Priority,
    RestartOn,
    RestartPolicy,
    Text,
    Timeout,
)
from mwms.server.schemas.job_views import (
    ATTEMPTS_SHOWN,
    AttemptEndingOut,
    AttemptEventOut,
    AttemptOut,
    JobEventOut,
    JobOut,
    JobPage,
    JobSummary,
    TaskOut,
)
from mwms.server.schemas.jobs import (
    DIGEST_PATTERN,
    ENV_NAME_PATTERN,
    JobCreate,
    PriorityChange,
)
from mwms.server.schemas.replicas import (
    ReplicaOut,
)
from mwms.server.schemas.sharing import (
    MAX_CORDON_REASON_CHARS,
    MAX_DRAIN_GRACE_SECONDS,
    MAX_QUOTA_DEVICES,
    CordonIn,
    CordonReason,
    DeviceAmounts,
    DeviceCounts,
    DrainIn,
    QueueEntry,
    QueuePage,
    QuotaCount,
    QuotaIn,
    TeamMemberOut,
    TeamOut,
)
from mwms.server.schemas.telemetry import (
    AgentDevicesOut,
    AgentLatestDevicesOut,
    DevicePointOut,
    DeviceSampleOut,
    DeviceSeriesOut,
    JobDevicesOut,
    LogLineOut,
    LogPage,
    MetricPointOut,
    MetricSeries,
    TaskDevicesOut,
)

__all__ = [
    "ATTEMPTS_SHOWN",
    "AgentDevicesOut",
    "AgentLatestDevicesOut",
    "AgentOut",
    "AgentTaskOut",
    "ArtifactOut",
    "AttemptEndingOut",
    "AttemptEventOut",
    "AttemptOut",
    "BundleOut",
    "CommunicationImplementation",
    "CommunicationOptions",
    "CordonIn",
    "CordonReason",
    "CpusPerWorker",
    "DEVICE_UUIDS_DESCRIPTION",
    "DEVICE_UUID_DESCRIPTION",
    "DIGEST_PATTERN",
    "DeviceAmounts",
    "DeviceCounts",
    "DeviceOut",
    "DevicePointOut",
    "DeviceSampleOut",
    "DeviceSeriesOut",
    "DrainIn",
    "ENV_NAME_PATTERN",
    "EnvironmentIn",
    "EnvironmentOut",
    "ErrorOut",
    "GraceSeconds",
    "HangTimeout",
    "JobCreate",
    "JobDevicesOut",
    "JobEventOut",
    "JobOut",
    "JobPage",
    "JobSummary",
    "JoinTokenCreate",
    "Lifetime",
    "LogLineOut",
    "LogPage",
    "LoginRequest",
    "MAX_CORDON_REASON_CHARS",
    "MAX_DRAIN_GRACE_SECONDS",
    "MAX_GRACE_SECONDS",
    "MAX_QUOTA_DEVICES",
    "MAX_TOKEN_LIFETIME_S",
    "MAX_TOKEN_NAME_CHARS",
    "MemoryPerWorker",
    "MetricPointOut",
    "MetricSeries",
    "Name",
    "Overview",
    "PRIORITY_HELP",
    "PRIORITY_NAME_PATTERN",
    "PreflightAttemptOut",
    "PreflightOut",
    "PreflightResultOut",
    "Priority",
    "PriorityChange",
    "QueueEntry",
    "QueuePage",
    "QuotaCount",
    "QuotaIn",
    "ReplicaOut",
    "RestartOn",
    "RestartPolicy",
    "RoleName",
    "SETTING_LIMIT",
    "StackDumpsOut",
    "StackThreadOut",
    "TIMEOUT_HELP",
    "TaskDevicesOut",
    "TaskOut",
    "TaskStacksOut",
    "TeamMemberOut",
    "TeamOut",
    "Text",
    "Timeout",
    "TokenCreate",
    "TokenCreated",
    "TokenOut",
    "ValidationErrorOut",
    "ValidationIssue",
    "WhoAmI",
    "WarmPoolOut",
]

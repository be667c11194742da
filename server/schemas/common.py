"""What several resources' models share: the setting-limit marker, the SIGTERM-to-SIGKILL grace, and the
descriptions of a task's GPUs."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, Strict

from mwms.server.schema_types import WHOLE_FLOATS_AS_INT

# A limit of the coordinator's settings in the document: server/api/openapi_document.py writes the
# setting's value in for the keyword (check_job_spec refuses what is over it).
SETTING_LIMIT = "x-mwms-setting-limit"


MAX_GRACE_SECONDS = 3600
# A SIGTERM-to-SIGKILL grace: the document states this coordinator's MWMS_MAX_PREEMPTION_GRACE_S too.
GraceSeconds = Annotated[
    int,
    Field(
        ge=0, le=MAX_GRACE_SECONDS, json_schema_extra={SETTING_LIMIT: {"maximum": "max_preemption_grace_s"}}
    ),
    Strict(),
    WHOLE_FLOATS_AS_INT,
]


DEVICE_UUIDS_DESCRIPTION = (
    'the UUID of each GPU of device_indices, in the same order, as its agent registered it ("" where '
    "unknown); empty for a CPU task"
)
DEVICE_UUID_DESCRIPTION = 'the GPU\'s UUID, as its agent registered it ("" where unknown)'

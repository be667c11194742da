"""An idempotent submit compares a resent spec with what the job stored, field by field, as jobs.py's
`spec_as_stored` names them: the same spec gets the same job back, any stored field that differs is named
in the refusal (priority, preemptible and the environment included). A real SQLite database."""

from __future__ import annotations

from typing import Any

import pytest

from mwms.server.db.engine import Database
from mwms.server.errors import Conflict
from mwms.server.schemas import JobCreate
from mwms.server.services.job_life.idempotency import find_or_create_job

DIGEST = "9" * 64
pytestmark = pytest.mark.db_seed(DIGEST)


def spec(**changes: Any) -> JobCreate:
    fields: dict[str, Any] = {
        "bundle_digest": DIGEST,
        "command": ["python", "train.py"],
        "workers": 2,
        "priority": "high",
        "environment": {"requirements": "requirements.txt", "locked": "tabulate==0.9.0\n"},
        "restart": {"max_restarts": 2},
    }
    return JobCreate.model_validate({**fields, **changes})


def submit(db: Database, job_spec: JobCreate, key: str = "run-1:step-1") -> tuple[str, bool]:
    with db.write() as session:
        job, created = find_or_create_job(session, job_spec, "alice", key)
        return job.id, created


def test_a_resent_spec_gets_its_job_back(db: Database) -> None:
    first, created = submit(db, spec())
    assert created
    assert submit(db, spec()) == (first, False)
    assert submit(db, spec(priority=750)) == (first, False)  # "high" is stored as 750


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"priority": "low"}, "priority"),
        ({"preemptible": False}, "preemptible"),
        ({"environment": {"locked": "tabulate==0.8.10\n"}}, "environment"),
        (
            {
                "environment": {
                    "requirements": "requirements.txt",
                    "locked": "tabulate==0.9.0\n",
                    "isolated": True,
                }
            },
            "environment",
        ),
        ({"restart": {"max_restarts": 3}}, "restart"),
        ({"workers": 3}, "workers"),
    ],
)
def test_a_key_reused_for_another_spec_is_refused_naming_the_field(
    db: Database, changes: dict[str, Any], named: str
) -> None:
    submit(db, spec())
    with pytest.raises(Conflict, match=f"with a different spec \\({named} differ"):
        submit(db, spec(**changes))

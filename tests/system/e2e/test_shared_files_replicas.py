"""Two `mwms server` replicas on one PostgreSQL database, each with its own data dir: a bundle uploaded
through replica A runs on an agent connected only to replica B, and the artifact that agent uploaded
through B downloads from A (server/services/storage/shared_files.py)."""

from __future__ import annotations

import time

import pytest

from mwms_testkit.cluster import pack
from mwms_testkit.replica_cluster import ReplicaCluster
from mwms_testkit.replica_cluster import replicated as two_replicas

pytestmark = [pytest.mark.e2e]

PROGRAM = """
import os
print("HELLO FROM A SHARED BUNDLE", flush=True)
with open(os.path.join(os.environ["MWMS_OUTPUT_DIR"], "result.txt"), "w") as out:
    out.write("made on the agent of replica B\\n")
"""


@pytest.fixture
def replicated(tmp_path, postgres):  # type: ignore[no-untyped-def]
    with two_replicas(
        tmp_path, postgres.create_database("shared_files"), 2, {"MWMS_HEARTBEAT_INTERVAL_S": "1"}
    ) as cluster:
        yield cluster


def test_a_bundle_uploaded_to_one_replica_runs_on_an_agent_of_the_other(replicated: ReplicaCluster) -> None:
    first, second = replicated.replicas
    replicated.start_agent("shared-1", [second], port_low=24200)
    replicated.wait_online(second, "shared-1")

    started = time.monotonic()
    digest = first.upload(pack({"main.py": PROGRAM}))
    assert not (second.root / "data" / "bundles" / digest).exists()
    body = {"bundle_digest": digest, "command": ["python", "main.py"], "workers": 1, "name": "shared"}
    response = first.http.post("/api/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]

    job = first.wait_for(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=30)
    assert job["state"] == "SUCCEEDED", job["reason"] + "\n" + first.logs_text(job_id)
    assert "HELLO FROM A SHARED BUNDLE" in first.logs_text(job_id)
    # Replica B served the bundle from the database, into its own data dir.
    assert (second.root / "data" / "bundles" / digest).is_file()

    # The agent uploaded its artifacts through B; A has no file of them until asked.
    artifact = first.root / "data" / "files" / job_id / "artifacts" / "attempt-1" / "result.txt"
    assert not artifact.exists()
    download = first.http.get(f"/api/v1/jobs/{job_id}/artifacts/result.txt")
    assert download.status_code == 200, download.text
    assert download.text == "made on the agent of replica B\n"
    assert artifact.is_file()
    print(f"bundle A -> agent on B -> artifact B -> A: {time.monotonic() - started:.1f} s")

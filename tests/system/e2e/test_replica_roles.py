"""Replica roles on one PostgreSQL database (issue 19): an API-only replica (REST and the dashboard, no
gRPC) and an agents-only one (the agents' gRPC, /healthz and /metrics, no API). A job submitted through the
API replica runs on an agent whose stream the agents replica holds (the decision reaches it by the
doorbell), its stacks can be dumped from the API replica, and a cancel through the API replica stops it."""

from __future__ import annotations

import time

import pytest

from mwms_testkit.cluster import wait_until
from mwms_testkit.replica_cluster import ReplicaCluster

pytestmark = pytest.mark.e2e
SLEEPER = "import time\nprint('started', flush=True)\nfor i in range(600):\n    print(i, flush=True)\n    time.sleep(0.5)\n"


@pytest.fixture(scope="module")
def roles(tmp_path_factory, postgres):
    cluster = ReplicaCluster(tmp_path_factory.mktemp("roles"), postgres.create_database("roles_e2e"))
    try:
        [api] = cluster.start_replicas(1, server_env={"MWMS_SERVE": "api"})
        [_, agents] = cluster.start_replicas(1, server_env={"MWMS_SERVE": "agents"})
        cluster.start_agent("role-agent", [agents], 25000)
        cluster.wait_online(api, "role-agent")
        yield cluster, api, agents
    finally:
        cluster.stop()


def test_each_role_serves_its_part_only(roles):
    _, api, agents = roles
    assert api.grpc_port == 0  # no gRPC listener at all
    assert agents.http.get("/healthz").status_code == 200
    assert agents.http.get("/metrics").status_code == 200
    assert agents.http.get("/api/v1/jobs").status_code == 404
    assert agents.http.get("/").status_code == 404  # no dashboard either

    def beaten() -> dict | None:  # the agents replica's next beat (about a second) counts the stream
        view = {row["serve"]: row for row in api.http.get("/api/v1/replicas").json() if row["alive"]}
        return view if view.get("agents", {}).get("agents_held") == 1 else None

    view = wait_until(beaten, 10, "the agents replica's beat counting the agent's stream")
    assert set(view) == {"api", "agents"}
    assert view["agents"]["agents_held"] == 1 and view["api"]["agents_held"] == 0
    assert view["api"]["grpc_address"] == "" and view["agents"]["grpc_address"].endswith(
        f":{agents.grpc_port}"
    )
    # The loops go to the replica that serves the API, leaving the agents-only one's loop to heartbeats.
    assert {"scheduler", "reconciler"} <= set(view["api"]["loops"]), view
    metrics = api.http.get("/metrics").text
    assert "mwms_replicas 2.0" in metrics
    assert 'mwms_replica_leads_loop{loop="scheduler"} 1.0' in metrics


def test_a_job_decided_on_the_api_replica_runs_on_an_agent_held_by_the_other(roles):
    _, api, _ = roles
    job_id = api.submit({"sleep.py": SLEEPER}, ["python", "sleep.py"], workers=1, name="cross-replica")
    api.wait_for(job_id, {"RUNNING"}, timeout=60)
    wait_until(lambda: "started" in api.logs_text(job_id), 30, "the job's first line")

    stacks = api.http.post(f"/api/v1/jobs/{job_id}/stacks")
    assert stacks.status_code in (200, 201), stacks.text
    [dump] = stacks.json()["tasks"]
    assert dump["answered"] and "sleep.py" in dump["text"], dump

    started = time.monotonic()
    assert api.http.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 200
    api.wait_for(job_id, {"CANCELLED"}, timeout=30)

    def stopped() -> bool:
        return all(t["state"] == "STOPPED" for t in api.job(job_id)["tasks"])

    wait_until(stopped, 30, "the task stopped by its agent, held by the other replica")
    assert time.monotonic() - started < 15

"""The gang's preflight check in real jobs: real agents, real TensorFlow, real sockets.

A 2-worker job with preflight passes the check, its results (all-reduce bandwidths) are readable over REST,
and the program then starts its own MWMS on the same ports. A job whose worker advertises an address
nobody listens on fails within seconds, with a reason naming both workers and the address.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from mwms_testkit import PROGRAMS
from mwms_testkit.cluster import MWMS, TERMINAL, Cluster, pack_dir, wait_until
from mwms_testkit.parallel import port_range

pytestmark = [pytest.mark.e2e, pytest.mark.tf]
PROGRAM = pack_dir(PROGRAMS / "preflight_user")
# TEST-NET-1 (RFC 5737): documentation only, never assigned, so nothing answers there.
NOBODY_ADDRESS = "192.0.2.1"


def _seconds(job: dict[str, Any], start: str, end: str) -> float:
    return (datetime.fromisoformat(job[end]) - datetime.fromisoformat(job[start])).total_seconds()


def test_preflight_passes_and_the_program_runs_on_the_same_ports(cluster: Cluster) -> None:
    job_id = cluster.submit(PROGRAM, ["python", "train.py"], workers=2, name="preflight-ok", preflight=True)
    job = cluster.wait_for(job_id, TERMINAL, timeout=240)
    logs = cluster.logs_text(job_id)
    assert job["state"] == "SUCCEEDED", f"{job['reason']}\n{logs}"
    assert logs.count("USER_OK sum=2") == 2, logs
    assert logs.count("mwms preflight: ok") == 2, logs

    found = cluster.http.get(f"/api/v1/jobs/{job_id}/preflight")
    assert found.status_code == 200, found.text
    attempts = found.json()["attempts"]
    assert [a["attempt"] for a in attempts] == [1] and attempts[0]["ok"], attempts
    results = attempts[0]["results"]
    assert [r["task_index"] for r in results] == [0, 1]
    for result in results:
        report = result["report"]
        assert result["ok"] and report["num_workers"] == 2, result
        sizes = [row["bytes"] for row in report["allreduce"]]
        assert sizes == [1 << 20, 64 << 20], report
        for row in report["allreduce"]:
            assert row["busbw_gbps"] > 0 and row["algbw_gbps"] > 0, row
            assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * (2 - 1) / 2)
        assert report["peers"][0]["worker"] == 1 - result["task_index"]
    print(f"preflight job: {_seconds(job, 'created_at', 'finished_at'):.1f} s submit->end; {results}")


@pytest.fixture(scope="module")
def unreachable_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A coordinator, one agent on loopback and one advertising an address nobody listens on."""
    instance = Cluster(root=tmp_path_factory.mktemp("unreachable"))
    try:
        instance.start_server()
        instance.start_agent("reachable", 21400)
        name = "advertises-nowhere"
        instance.agents[name] = instance._spawn(
            name,
            [
                "agent",
                "--server",
                f"127.0.0.1:{instance.grpc_port}",
                "--name",
                name,
                "--work-dir",
                str(instance.root / name),
                "--slots",
                "1",
                "--advertise-address",
                NOBODY_ADDRESS,
                "--port-range",
                port_range(21500),
            ],
            instance.agent_environment(),
        )
        wait_until(lambda: instance.agent_online(name), 60, f"agent {name} online")
        yield instance
    finally:
        instance.stop()


def test_unreachable_peer_fails_the_job_within_seconds_naming_both_workers(
    unreachable_cluster: Cluster,
) -> None:
    cluster = unreachable_cluster
    job_id = cluster.submit(
        PROGRAM,
        ["python", "train.py"],
        workers=2,
        name="preflight-unreachable",
        preflight=True,
        env={"MWMS_PREFLIGHT_CONNECT_TIMEOUT_S": "3"},
    )
    job = cluster.wait_for(job_id, TERMINAL, timeout=120)
    logs = cluster.logs_text(job_id)
    assert job["state"] == "FAILED", f"{job['reason']}\n{logs}"
    reason = job["reason"]
    assert "preflight check failed" in reason, reason
    assert "worker 0" in reason and "worker 1" in reason, reason
    assert f"{NOBODY_ADDRESS}:" in reason, reason
    assert "USER_OK" not in logs, "the program must not run after a failed check"
    # Scheduled -> failed: the connect deadline (3 s) plus the workers' start, not a collective timeout.
    scheduled = next(e["at"] for e in job["events"] if e["to_state"] == "SCHEDULED")
    took = (datetime.fromisoformat(job["finished_at"]) - datetime.fromisoformat(scheduled)).total_seconds()
    assert took < 30, f"took {took:.1f} s: {reason}"
    results = cluster.http.get(f"/api/v1/jobs/{job_id}/preflight").json()["attempts"]
    failed = [r for a in results for r in a["results"] if not r["ok"]]
    assert failed and NOBODY_ADDRESS in failed[0]["message"], results
    print(f"failed {took:.1f} s after placement: {reason.splitlines()[0]}")


def _doctor(cluster: Cluster, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MWMS_")}
    return subprocess.run(
        [MWMS, "doctor", "--api", cluster.api, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**env, "MWMS_TOKEN": cluster.admin_token, "COLUMNS": "200"},
    )


def test_doctor_prints_reachability_allreduce_and_tcp_bandwidth_per_worker(cluster: Cluster) -> None:
    shown = _doctor(cluster, "--agents", "e2e-1,e2e-2", "--tcp-mb", "16")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "doctor job" in shown.stderr and "SUCCEEDED" in shown.stderr  # progress on stderr
    lines = shown.stdout.splitlines()
    assert "1 MB BUSBW" in lines[0] and "64 MB BUSBW" in lines[0] and "TCP" in lines[0], shown.stdout
    assert lines[1].split()[:2] == ["0", "e2e-1"] and lines[2].split()[:2] == ["1", "e2e-2"], shown.stdout
    assert all(line.rstrip().endswith("ok") for line in lines[1:3]), shown.stdout
    print(shown.stdout)

    as_json = _doctor(cluster, "--agents", "e2e-2,e2e-1", "--tcp-mb", "8", "--json")
    assert as_json.returncode == 0, as_json.stdout + as_json.stderr
    found = json.loads(as_json.stdout)
    assert found["ok"] and found["state"] == "SUCCEEDED"
    assert [(w["worker"], w["agent"]) for w in found["workers"]] == [(0, "e2e-2"), (1, "e2e-1")]
    for worker in found["workers"]:
        assert worker["tcp"]["bytes"] == 8 << 20 and worker["tcp"]["gbps"] > 0
        assert [a["bytes"] for a in worker["allreduce"]] == [1 << 20, 64 << 20]
        assert all(a["busbw_gbps"] > 0 for a in worker["allreduce"])


def test_doctor_on_an_unknown_agent_says_why_it_waits_and_gives_up(cluster: Cluster) -> None:
    shown = _doctor(cluster, "--agents", "e2e-1,no-such-agent", "--timeout", "3s", timeout=60)
    assert shown.returncode == 2, shown.stdout + shown.stderr
    assert "no-such-agent is offline or unknown" in shown.stderr, shown.stderr
    assert "was cancelled" in shown.stderr, shown.stderr

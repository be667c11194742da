"""A gang of one gets a TF_CONFIG of one worker, as the agent gives it: the runtime and preflight cope."""

from __future__ import annotations

import json
import time

import pytest

from mwms_runtime.preflight import parse_endpoints
from mwms_runtime.reachability import check_reachability
from mwms_testkit.runtime_cluster import EXAMPLES, free_ports, read_metrics, run_tasks


def _one_worker_tf_config(port: int) -> str:
    return json.dumps({"cluster": {"worker": [f"localhost:{port}"]}, "task": {"type": "worker", "index": 0}})


def test_a_single_worker_has_no_peers_to_reach_and_passes_at_once() -> None:
    endpoints, index = parse_endpoints(_one_worker_tf_config(free_ports(1)[0]))
    started = time.monotonic()
    found = check_reachability(endpoints, index, timeout_s=5.0, stream_bytes=1 << 20)
    assert found.ok, found.failure
    assert found.connect_s == {} and found.tcp_sent is None
    assert time.monotonic() - started < 2.0


@pytest.mark.tf
def test_the_runtime_trains_and_reports_with_a_one_worker_tf_config(tmp_path) -> None:
    [result] = run_tasks(
        [str(EXAMPLES / "custom_loop" / "train.py"), "--steps", "4", "--print-every", "1"],
        cwd=tmp_path / "bundle",
        root=tmp_path,
        num_workers=1,
        TF_CONFIG=_one_worker_tf_config(free_ports(1)[0]),
    )
    assert result.returncode == 0, result.describe()
    losses = [line for line in read_metrics(tmp_path / "metrics-0.jsonl") if line["name"] == "loss"]
    assert [line["step"] for line in losses] == [1, 2, 3, 4], result.describe()

"""Phase 1 of the preflight check on real loopback sockets, the bandwidth arithmetic, and TF_CONFIG parsing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from mwms.preflight_contract import algbw_gbps, busbw_gbps, parse_report
from mwms_runtime.preflight import parse_endpoints
from mwms_runtime.reachability import Endpoint, Reachability, check_reachability
from mwms_testkit.cluster import free_port


def test_busbw_is_algbw_times_2_n_minus_1_over_n() -> None:
    assert busbw_gbps(1.0, 1) == 0.0  # a single worker moves nothing
    assert busbw_gbps(1.0, 2) == 1.0
    assert busbw_gbps(3.0, 4) == pytest.approx(4.5)
    assert busbw_gbps(2.0, 8) == pytest.approx(3.5)
    assert algbw_gbps(64 << 20, 0.5) == pytest.approx((64 << 20) / 0.5 / 1e9)
    assert algbw_gbps(1, 0.0) == 0.0
    with pytest.raises(ValueError):
        busbw_gbps(1.0, 0)


def test_report_parsing_tolerates_garbage() -> None:
    assert parse_report('{"ok": true}') == {"ok": True}
    assert parse_report("") == {} and parse_report("[1]") == {} and parse_report("{bad") == {}


def test_parse_endpoints_reads_tf_config() -> None:
    config = {"cluster": {"worker": ["10.0.0.1:2000", "[::1]:2001"]}, "task": {"type": "worker", "index": 1}}
    endpoints, index = parse_endpoints(json.dumps(config))
    assert index == 1
    assert endpoints == [Endpoint(0, "10.0.0.1", 2000), Endpoint(1, "::1", 2001)]
    for bad in ("", "{}", json.dumps({"cluster": {"worker": ["nohost"]}, "task": {"index": 0}})):
        with pytest.raises(ValueError):
            parse_endpoints(bad)


def _gang(size: int) -> list[Endpoint]:
    return [Endpoint(i, "127.0.0.1", free_port()) for i in range(size)]


def _run_all(
    endpoints: list[Endpoint], indexes: list[int], timeout_s: float, stream_bytes: int = 0, delays=None
) -> dict[int, Reachability]:
    results: dict[int, Reachability] = {}

    def worker(i: int) -> None:
        time.sleep((delays or {}).get(i, 0.0))
        results[i] = check_reachability(endpoints, i, timeout_s, stream_bytes, bind_host="127.0.0.1")

    threads = [threading.Thread(target=worker, args=(i,)) for i in indexes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s + 90)
    return results


def test_a_gang_that_starts_at_different_moments_reaches_itself_and_frees_its_ports() -> None:
    endpoints = _gang(3)
    results = _run_all(endpoints, [0, 1, 2], timeout_s=10, delays={2: 1.0})
    for i, result in results.items():
        assert result.ok, result.failure
        assert result.heard_from == {0, 1, 2} - {i}
        assert sorted(result.connect_s) == sorted({0, 1, 2} - {i})
    for endpoint in endpoints:  # TensorFlow binds the same port right after
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", endpoint.port))
            probe.listen()


def test_a_missing_peer_fails_naming_both_workers_and_the_address() -> None:
    endpoints = _gang(2)
    started = time.monotonic()
    result = _run_all(endpoints, [0], timeout_s=1.5)[0]
    assert not result.ok
    assert time.monotonic() - started < 10
    assert "worker 0 (host 127.0.0.1) cannot reach worker 1 at " + endpoints[1].address in result.failure
    assert "connection refused" in result.failure and "--advertise-address" in result.failure


def test_a_peer_that_never_connects_is_named_by_the_listening_side() -> None:
    endpoints = _gang(2)
    # Worker 1's port answers (so worker 0 can say hello) but worker 1 never connects back.
    with socket.socket() as fake:
        fake.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        fake.bind(("127.0.0.1", endpoints[1].port))
        fake.listen()

        def answer() -> None:
            conn, _ = fake.accept()
            with conn:
                conn.recv(100)
                conn.sendall(b"ok 1\n")
                while conn.recv(100):
                    pass

        threading.Thread(target=answer, daemon=True).start()
        result = _run_all(endpoints, [0], timeout_s=1.0)[0]
    assert not result.ok
    assert result.failure.startswith(
        f"worker 1 (host 127.0.0.1) did not reach worker 0 (host 127.0.0.1) at {endpoints[0].address}"
    )


def test_a_port_held_by_another_program_is_told_apart_from_the_peer() -> None:
    endpoints = _gang(2)
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(("127.0.0.1", endpoints[1].port))
        other.listen()

        def answer() -> None:
            conn, _ = other.accept()
            with conn:
                conn.sendall(b"HTTP/1.0 400 Bad Request\n")

        threading.Thread(target=answer, daemon=True).start()
        result = _run_all(endpoints, [0], timeout_s=2.0)[0]
    assert "did not answer as worker 1" in result.failure, result.failure


def test_tcp_stream_to_the_next_worker_is_timed() -> None:
    endpoints = _gang(2)
    results = _run_all(endpoints, [0, 1], timeout_s=10, stream_bytes=8 << 20)
    for i, result in results.items():
        assert result.ok, result.failure
        assert result.tcp_sent is not None and result.tcp_sent["to_worker"] == 1 - i
        assert result.tcp_sent["bytes"] == 8 << 20 and result.tcp_sent["gbps"] > 0
        assert result.tcp_received is not None and result.tcp_received["from_worker"] == 1 - i


def test_the_check_with_reachability_only_passes_fast_without_tensorflow(tmp_path) -> None:
    endpoints = _gang(2)
    workers = [f"127.0.0.1:{e.port}" for e in endpoints]
    processes = []
    for index in range(2):
        config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = {
            **os.environ,
            "TF_CONFIG": json.dumps(config),
            "MWMS_PREFLIGHT_ALLREDUCE": "0",
            "MWMS_PREFLIGHT_REPORT": str(tmp_path / f"report-{index}.json"),
        }
        processes.append(
            subprocess.Popen(
                [sys.executable, "-X", "importtime", "-m", "mwms_runtime.preflight"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for index, process in enumerate(processes):
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, out + err[-2000:]
        report = json.loads((tmp_path / f"report-{index}.json").read_text())
        assert report["ok"] and report["allreduce"] == [] and report["peers"][0]["worker"] == 1 - index
        assert " tensorflow" not in err, "phase 1 alone must not import TensorFlow"
        assert "mwms preflight: ok: peers reachable" in out

"""The gang's preflight check, run by the agent as ``python -m mwms_runtime.preflight`` before the program.

Phase 1 (no TensorFlow, seconds): every worker reaches every other on its TF_CONFIG port
(mwms_runtime.reachability). Phase 2: the job's MultiWorkerMirroredStrategy, built as the runtime builds
it (strategy_factory, communication options from the MWMS_* environment), all-reduces 1 MB and 64 MB
(one warm-up, then timed iterations) and checks the sum. TensorFlow is imported in a background thread
while phase 1 waits for the peers, so the import costs little extra time. With MWMS_PREFLIGHT_ALLREDUCE=0
only phase 1 runs, and TensorFlow is not imported at all.

The report goes to the file named by MWMS_PREFLIGHT_REPORT (contract: mwms/preflight_contract.py) and
the exit code says the outcome. The process ends with os._exit right after a last all-reduce that every
worker reaches, so all workers release their ports (and worker 0 its coordination service) within
moments of each other and before any of them starts the program, which binds the same ports.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from typing import Any

from mwms import task_environment
from mwms.preflight_contract import (
    ALLREDUCE_ENV,
    ALLREDUCE_SIZES,
    CONNECT_TIMEOUT_ENV,
    DEFAULT_CONNECT_TIMEOUT_S,
    EXIT_BAD_CONFIG,
    EXIT_COLLECTIVE_FAILED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    REPORT_ENV,
    TCP_MB_ENV,
    algbw_gbps,
    busbw_gbps,
)
from mwms_runtime.reachability import Endpoint, check_reachability, describe_worker


def parse_endpoints(tf_config: str) -> tuple[list[Endpoint], int]:
    """(the workers of TF_CONFIG in order, this task's index); ValueError when it is not usable."""
    try:
        config = json.loads(tf_config)
        workers = config["cluster"]["worker"]
        task = config["task"]
        index = int(task.get("index", 0))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"TF_CONFIG does not describe a cluster of workers: {error}") from error
    if config.get("cluster", {}).get("chief") or task.get("type", "worker") != "worker":
        raise ValueError("the preflight check supports clusters of workers only (no separate chief)")
    endpoints = []
    for i, address in enumerate(workers):
        host, _, port = str(address).rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"TF_CONFIG worker {i} has address {address!r}, not host:port")
        endpoints.append(Endpoint(i, host.strip("[]"), int(port)))
    if not 0 <= index < len(endpoints):
        raise ValueError(f"TF_CONFIG task index {index} is outside the {len(endpoints)} workers")
    return endpoints, index


def _float_env(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        return float(raw) if raw else default
    except ValueError:
        return default


def measure_allreduce(strategy: Any) -> list[dict[str, Any]]:
    """All-reduces each size of ALLREDUCE_SIZES (warm-up, then timed) and checks the sum on every element.

    busbw's n is the number of replicas (workers × GPUs per worker), the ranks nccl-tests would count.
    """
    import tensorflow as tf

    @tf.function
    def run(values: Any) -> Any:
        # strategy.reduce of a per-replica value is MWMS's all-reduce across every worker (as in_graph
        # does); min and max of the sum prove every element arrived, without copying 64 MB out.
        reduced = strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None)
        return tf.stack([tf.reduce_min(reduced), tf.reduce_max(reduced)])

    results = []
    for num_bytes, iterations in ALLREDUCE_SIZES:
        values = strategy.experimental_distribute_values_from_function(
            lambda _, count=num_bytes // 4: tf.ones([count], dtype=tf.float32)
        )
        expected = float(strategy.num_replicas_in_sync)
        _check_sum(run(values), expected, num_bytes)  # warm-up: traces and sets up the group
        started = time.perf_counter()
        for _ in range(iterations):
            out = run(values)
        _check_sum(out, expected, num_bytes)
        seconds = (time.perf_counter() - started) / iterations
        algbw = algbw_gbps(num_bytes, seconds)
        results.append(
            {
                "bytes": num_bytes,
                "iterations": iterations,
                "seconds": seconds,
                "algbw_gbps": algbw,
                "busbw_gbps": busbw_gbps(algbw, strategy.num_replicas_in_sync),
            }
        )
    return results


def _check_sum(out: Any, expected: float, num_bytes: int) -> None:
    low, high = (float(x) for x in out.numpy())
    if low != expected or high != expected:
        raise RuntimeError(
            f"the all-reduce of {num_bytes} bytes gave sums between {low:g} and {high:g}, "
            f"expected {expected:g} everywhere"
        )


def _import_tensorflow() -> None:
    try:
        import tensorflow  # noqa: F401
    except Exception:  # noqa: BLE001, S110 - phase 2 imports it again and reports the error
        pass


def run_check(report: dict[str, Any]) -> int:
    """Runs both phases, filling `report`; returns the exit code."""
    started = time.monotonic()
    try:
        endpoints, index = parse_endpoints(os.environ.get(task_environment.TF_CONFIG, ""))
    except ValueError as error:
        report.update(ok=False, phase="config", message=f"preflight check: {error}")
        return EXIT_BAD_CONFIG
    me = endpoints[index]
    report.update(worker=index, host=me.host, num_workers=len(endpoints))
    allreduce = os.environ.get(ALLREDUCE_ENV, "").strip() != "0"
    if allreduce:
        threading.Thread(target=_import_tensorflow, name="import-tensorflow", daemon=True).start()

    timeout_s = _float_env(CONNECT_TIMEOUT_ENV, DEFAULT_CONNECT_TIMEOUT_S)
    stream_bytes = int(_float_env(TCP_MB_ENV, 0.0) * (1 << 20))
    found = check_reachability(endpoints, index, timeout_s, stream_bytes)
    report["reachable_s"] = found.seconds
    report["peers"] = [
        {"worker": i, "address": endpoints[i].address, "connect_s": s}
        for i, s in sorted(found.connect_s.items())
    ]
    report["tcp"] = found.tcp_sent
    if not found.ok:
        report.update(ok=False, phase="reachability", message=found.failure)
        return EXIT_UNREACHABLE
    if not allreduce:
        report.update(ok=True, phase="done", message="", allreduce=[], total_s=time.monotonic() - started)
        return EXIT_OK

    try:
        from mwms_runtime.strategy_factory import communication_options, strategy

        built = strategy()
        report["collective"] = communication_options().implementation.name
        report["replicas"] = built.num_replicas_in_sync
        report["allreduce"] = measure_allreduce(built)
        # Every worker reaches this before any exits: no one leaves a peer waiting in a collective.
        _barrier(built)
    except Exception as error:  # noqa: BLE001 - any failure of the collective is the check's finding
        traceback.print_exc()
        report.update(
            ok=False,
            phase="allreduce",
            message=f"{describe_worker(me)}: the all-reduce check failed: {type(error).__name__}: "
            f"{_first_line(error)}",
        )
        return EXIT_COLLECTIVE_FAILED
    report.update(ok=True, phase="done", message="", total_s=time.monotonic() - started)
    return EXIT_OK


def _first_line(error: BaseException) -> str:
    lines = [x.strip() for x in str(error).splitlines() if x.strip() and x.strip() != "in user code:"]
    return lines[-1][:400] if lines else ""


def _barrier(strategy: Any) -> None:
    import tensorflow as tf

    ones = strategy.experimental_distribute_values_from_function(lambda _: tf.ones([1]))
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, ones, axis=None)
    _check_sum(
        tf.stack([tf.reduce_min(total), tf.reduce_max(total)]), float(strategy.num_replicas_in_sync), 4
    )


def summary(report: dict[str, Any]) -> str:
    """One line for the task's log: what was measured, or what failed."""
    if not report.get("ok"):
        return f"mwms preflight: FAILED: {report.get('message', '')}"
    parts = [f"peers reachable in {report.get('reachable_s', 0):.2f} s"]
    if report.get("tcp"):
        parts.append(f"TCP {report['tcp']['gbps']:.2f} GB/s")
    for row in report.get("allreduce", []):
        parts.append(
            f"all-reduce {row['bytes'] >> 20} MB: algbw {row['algbw_gbps']:.3f} GB/s, "
            f"busbw {row['busbw_gbps']:.3f} GB/s"
        )
    return "mwms preflight: ok: " + "; ".join(parts) + f" ({report.get('total_s', 0):.1f} s)"


def main() -> None:
    report: dict[str, Any] = {"ok": False, "phase": "start", "message": ""}
    try:
        code = run_check(report)
    except Exception as error:  # noqa: BLE001 - the agent must get a report whatever happened
        report.update(ok=False, message=f"preflight check crashed: {type(error).__name__}: {error}")
        code = EXIT_COLLECTIVE_FAILED
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(report, out)
    print(summary(report), file=sys.stderr if code else sys.stdout, flush=True)
    # Not sys.exit: TensorFlow's teardown (coordination service shutdown barrier) can take seconds or
    # wait on a peer that has already left; the ports must be free for the program now.
    os._exit(code)


if __name__ == "__main__":
    main()

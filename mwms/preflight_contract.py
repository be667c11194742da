"""The preflight check's contract between the agent that runs it and mwms_runtime.preflight, which is it.

The agent runs ``python -m mwms_runtime.preflight`` in the task's environment (same TF_CONFIG, same port)
with ``MWMS_PREFLIGHT_REPORT`` naming a file; the check writes its JSON report there and exits with
``EXIT_OK`` or one of the failure codes. The report (also sent to the coordinator as
PreflightResult.report_json)::

    {"ok": true, "worker": 0, "host": "10.0.0.1", "num_workers": 2, "phase": "done", "message": "",
     "reachable_s": 0.02, "peers": [{"worker": 1, "address": "10.0.0.2:20001", "connect_s": 0.01}],
     "tcp": {"to_worker": 1, "bytes": .., "seconds": .., "gbps": ..} | null,
     "collective": "RING", "replicas": 2, "allreduce": [{"bytes": 1048576, "iterations": 5, "seconds": ..,
     "algbw_gbps": .., "busbw_gbps": ..}], "total_s": 3.1}

Bandwidths are in GB/s (10^9 bytes per second); ``busbw = algbw * 2 (n - 1) / n`` as nccl-tests define
it for all-reduce, n being the replicas (workers × GPUs per worker), so figures from gangs of different
sizes compare with the link's speed.

Dependency-free (standard library only).
"""

from __future__ import annotations

import json
from typing import Any

# Set by the agent: where the check writes its report.
REPORT_ENV = "MWMS_PREFLIGHT_REPORT"
# Seconds phase 1 keeps trying to reach the peers (job env may set it); default DEFAULT_CONNECT_TIMEOUT_S.
CONNECT_TIMEOUT_ENV = "MWMS_PREFLIGHT_CONNECT_TIMEOUT_S"
DEFAULT_CONNECT_TIMEOUT_S = 15.0
# MB each worker streams to the next over a plain socket in phase 1 (mwms doctor sets it); 0: none.
TCP_MB_ENV = "MWMS_PREFLIGHT_TCP_MB"
# "0": phase 1 only (reachability, no TensorFlow, well under a second of its own); anything else: both phases.
ALLREDUCE_ENV = "MWMS_PREFLIGHT_ALLREDUCE"
# Sizes all-reduced in phase 2, with timed iterations after one warm-up each.
ALLREDUCE_SIZES = ((1 << 20, 5), (64 << 20, 3))

EXIT_OK = 0
EXIT_UNREACHABLE = 3  # phase 1: a peer could not be reached (or did not reach us)
EXIT_COLLECTIVE_FAILED = 4  # phase 2: the strategy or an all-reduce failed, or gave a wrong sum
EXIT_BAD_CONFIG = 5  # TF_CONFIG is missing or malformed


def algbw_gbps(num_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth: bytes reduced per second, in GB/s."""
    return num_bytes / seconds / 1e9 if seconds > 0 else 0.0


def busbw_gbps(algbw: float, num_workers: int) -> float:
    """Bus bandwidth of an all-reduce over `num_workers`: algbw × 2(n−1)/n (0 for a single worker)."""
    if num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, got {num_workers}")
    return algbw * 2 * (num_workers - 1) / num_workers


def parse_report(text: str) -> dict[str, Any]:
    """The report as a dict; an unreadable one becomes {} (the message and exit code still tell)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def size_label(num_bytes: int) -> str:
    """1048576 -> '1 MB' (binary megabytes, as the sizes are chosen)."""
    return f"{num_bytes / (1 << 20):g} MB"

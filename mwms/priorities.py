"""Job priorities as every part of mwms names them: a number from 0 to MAX_PRIORITY, higher placed first,
or one of three band names that stand for a number.

Dependency-free: the API's schema (server/schemas/job_parts.py), the CLI (mwms/cli/parsing.py), the queue's
Prometheus series (server/observability/instruments.py) and its counts (server/services/observing/cluster_counts.py)
read the same values from here.
"""

from __future__ import annotations

MAX_PRIORITY = 1000
# A band's name and the number it stands for when a job is submitted with it.
PRIORITY_NAMES = {"low": 250, "normal": 500, "high": 750}
DEFAULT_PRIORITY = PRIORITY_NAMES["normal"]
# How priorities are counted in bands (metrics, the queue): low < 250 <= normal < 750 <= high.
PRIORITY_BANDS = ("low", "normal", "high")
NORMAL_PRIORITY_FROM = PRIORITY_NAMES["low"]
HIGH_PRIORITY_FROM = PRIORITY_NAMES["high"]


def priority_band(priority: int) -> str:
    """The band a priority is counted in: low (< 250), normal (< 750) or high."""
    if priority < NORMAL_PRIORITY_FROM:
        return "low"
    return "normal" if priority < HIGH_PRIORITY_FROM else "high"

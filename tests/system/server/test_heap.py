"""The coordinator process freezes its start-up heap and collects young objects less often (server/heap.py)."""

from __future__ import annotations

import subprocess
import sys


def test_settle_heap_freezes_what_exists_and_raises_the_young_threshold() -> None:
    # In a process of its own: freezing the test process's heap would outlive this test.
    program = (
        "import gc; from mwms.server.heap import YOUNG_THRESHOLD, settle_heap; import mwms.server.app; "
        "before = gc.get_threshold(); settle_heap(); after = gc.get_threshold(); "
        "assert gc.get_freeze_count() > 10_000, gc.get_freeze_count(); "
        "assert after == (YOUNG_THRESHOLD, before[1], before[2]), after; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr

"""tests/unit: no process, no socket, no server (mwms_testkit/tiers.py)."""

import pytest

from mwms_testkit import tiers


@pytest.fixture(autouse=True)
def _unit_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    tiers.refuse_processes(monkeypatch, "unit")
    tiers.refuse_sockets(monkeypatch, "unit")
    tiers.in_process_coordinators(monkeypatch)

"""tests/integration: in-process coordinators, fake APIs, loopback servers; no process (mwms_testkit/tiers.py)."""

import pytest

from mwms_testkit import tiers


@pytest.fixture(autouse=True)
def _integration_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    tiers.refuse_processes(monkeypatch, "integration")
    tiers.in_process_coordinators(monkeypatch)

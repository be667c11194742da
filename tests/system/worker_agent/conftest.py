"""The agent's test fixtures, from the scaffolding (mwms_testkit/fake_coordinator.py)."""

from mwms_testkit.fake_coordinator import agent_channel, coordinator, serve_coordinator, start_agent, wait_for  # noqa: F401

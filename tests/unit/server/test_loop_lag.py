"""The coordinator's event-loop lag probe (server/live/loop_lag.py): a loop held busy shows in
mwms_event_loop_lag_seconds by at least as long as it was held."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import REGISTRY

from mwms.server.live.loop_lag import LoopLagProbe


def _lag() -> tuple[float, float, float]:
    def value(suffix: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(f"mwms_event_loop_lag_seconds{suffix}", labels) or 0.0

    return value("_count"), value("_sum"), value("_bucket", le="0.1")


def test_a_loop_held_busy_shows_as_lag_as_long_as_it_was_held() -> None:
    async def scenario() -> int:
        probe = LoopLagProbe(interval_s=0.01)
        probe.start()
        while probe.samples < 3:  # timers fire on a loop that is free
            await asyncio.sleep(0.005)
        before = _lag()
        time.sleep(0.3)  # the loop is held: the probe's timer is due and cannot run
        while probe.samples < 6:
            await asyncio.sleep(0.005)
        after = _lag()
        await probe.stop()
        count, total, within_100ms = (a - b for a, b in zip(after, before, strict=True))
        assert count >= 3
        assert total >= 0.25  # the 0.3 s hold, less the interval the timer had left
        assert within_100ms <= count - 1  # that observation is in no bucket below 0.25 s
        return probe.samples

    samples = asyncio.run(scenario())
    assert samples >= 6


def test_stop_ends_the_probe_and_stopping_one_never_started_is_harmless() -> None:
    async def scenario() -> None:
        await LoopLagProbe().stop()
        probe = LoopLagProbe(interval_s=0.01)
        probe.start()
        await asyncio.sleep(0.05)
        await probe.stop()
        seen = probe.samples
        await asyncio.sleep(0.05)
        assert probe.samples == seen

    asyncio.run(scenario())

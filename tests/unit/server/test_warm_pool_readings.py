"""An agent's warm-pool figures from its heartbeats (server/live/liveness.py) are held to what a pool can be:
a hostile or broken agent's negative or enormous counts and memory are stored bounded, not as sent."""

from __future__ import annotations

from mwms.agent_defaults import MAX_WARM_POOL
from mwms.server.live.liveness import MAX_POOL_BYTES, POOL_MEMORY_STEP, Liveness


def test_counts_and_memory_out_of_range_are_held_to_the_bounds() -> None:
    liveness = Liveness()
    liveness.warm_pool("a", 2**31 - 1, 2**63 - 1)
    liveness.warm_pool("b", -5, -1)
    pools = liveness.take_pools()
    assert pools["a"] == (MAX_WARM_POOL, MAX_POOL_BYTES // POOL_MEMORY_STEP * POOL_MEMORY_STEP)
    assert pools["b"] == (0, 0)


def test_a_pool_that_only_breathes_is_not_written_again() -> None:
    liveness = Liveness()
    liveness.warm_pool("a", 1, 544 * 1024**2)
    assert liveness.take_pools() == {"a": (1, 544 * 1024**2)}
    liveness.warm_pool("a", 1, 544 * 1024**2 + 1000)
    assert liveness.take_pools() == {}

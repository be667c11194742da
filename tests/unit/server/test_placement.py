"""Gang placement rules: all or nothing, equal devices per task, ports unique per agent."""

from __future__ import annotations

import random

from mwms.server.services.scheduler.placement import AgentCapacity, NoFit, place_gang


def gpu_agent(
    name: str, gpus: int, free: tuple[int, ...] | None = None, used_ports=frozenset()
) -> AgentCapacity:
    return AgentCapacity(
        agent_id=name,
        name=name,
        address=f"{name}.local",
        device_kind="gpu",
        all_devices=tuple(range(gpus)),
        free_devices=tuple(range(gpus)) if free is None else free,
        port_low=20000,
        port_high=20009,
        used_ports=frozenset(used_ports),
    )


def cpu_agent(
    name: str, slots: int = 1, ports: tuple[int, int] = (20000, 20009), used_ports=frozenset()
) -> AgentCapacity:
    return AgentCapacity(
        agent_id=name,
        name=name,
        address="127.0.0.1",
        device_kind="cpu",
        all_devices=tuple(range(slots)),
        free_devices=tuple(range(slots)),
        port_low=ports[0],
        port_high=ports[1],
        used_ports=frozenset(used_ports),
    )


def test_two_workers_spread_over_two_agents_with_equal_gpus():
    result = place_gang([gpu_agent("a", 4), gpu_agent("b", 4)], workers=2, gpus_per_worker=2)
    assert not isinstance(result, NoFit)
    assert {p.agent_id for p in result} == {"a", "b"}
    assert all(len(p.device_indices) == 2 for p in result)
    assert [p.index for p in result] == [0, 1]


def test_all_or_nothing_when_only_some_workers_fit_now():
    agents = [gpu_agent("a", 2, free=(0, 1)), gpu_agent("b", 2, free=())]
    result = place_gang(agents, workers=2, gpus_per_worker=2)
    assert isinstance(result, NoFit)
    assert "waiting for capacity" in result.reason


def test_more_gpus_than_any_agent_has_says_so():
    result = place_gang([gpu_agent("a", 2), gpu_agent("b", 4)], workers=1, gpus_per_worker=8)
    assert isinstance(result, NoFit)
    assert "largest agent (b) has 4" in result.reason and "--gpus-per-worker" in result.reason


def test_cluster_too_small_even_when_idle():
    result = place_gang([cpu_agent("a"), cpu_agent("b")], workers=3, gpus_per_worker=0)
    assert isinstance(result, NoFit)
    assert "at most 2" in result.reason


def test_cpu_job_needs_cpu_slots_not_gpus():
    result = place_gang([gpu_agent("a", 8)], workers=1, gpus_per_worker=0)
    assert isinstance(result, NoFit)
    assert "--slots" in result.reason


def test_several_workers_on_one_agent_get_distinct_devices_and_ports():
    result = place_gang([gpu_agent("a", 4)], workers=2, gpus_per_worker=2, rng=random.Random(1))
    assert not isinstance(result, NoFit)
    assert set(result[0].device_indices).isdisjoint(result[1].device_indices)
    assert result[0].port != result[1].port


def test_ports_held_by_live_tasks_are_not_reused():
    used = frozenset(range(20000, 20009))  # only 20009 is free
    result = place_gang([cpu_agent("a", used_ports=used)], workers=1, gpus_per_worker=0)
    assert not isinstance(result, NoFit)
    assert result[0].port == 20009


def test_full_port_range_blocks_placement():
    result = place_gang(
        [cpu_agent("a", ports=(20000, 20000), used_ports={20000})], workers=1, gpus_per_worker=0
    )
    assert isinstance(result, NoFit)


def test_ports_stay_within_the_agent_range():
    for seed in range(20):
        result = place_gang([cpu_agent("a", slots=4, ports=(30000, 30003))], 4, 0, rng=random.Random(seed))
        assert not isinstance(result, NoFit)
        assert sorted(p.port for p in result) == [30000, 30001, 30002, 30003]

"""Placement pinned to named agents (JobCreate.agents): worker i on agents[i], or a reason naming the agent."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from mwms.server.schemas import JobCreate
from mwms.server.services.scheduler.placement import AgentCapacity, NoFit, place_pinned

DIGEST = "0" * 64


def agent(name: str, slots: int = 1, free: int | None = None, kind: str = "cpu") -> AgentCapacity:
    return AgentCapacity(
        agent_id=f"id-{name}",
        name=name,
        address=f"{name}.local",
        device_kind=kind,
        all_devices=tuple(range(slots)),
        free_devices=tuple(range(slots if free is None else free)),
        port_low=20000,
        port_high=20009,
    )


def test_worker_i_runs_on_the_ith_named_agent_by_name_or_id() -> None:
    agents = [agent("a", slots=4), agent("b"), agent("c")]
    placed = place_pinned(agents, ["c", "id-a"], 0, random.Random(1))
    assert not isinstance(placed, NoFit)
    assert [(p.index, p.agent_id, p.address) for p in placed] == [
        (0, "id-c", "c.local"),
        (1, "id-a", "a.local"),
    ]


def test_the_same_agent_twice_takes_two_slots_and_two_ports() -> None:
    placed = place_pinned([agent("a", slots=2)], ["a", "a"], 0, random.Random(1))
    assert not isinstance(placed, NoFit)
    assert {p.device_indices for p in placed} == {(0,), (1,)}
    assert placed[0].port != placed[1].port
    busy = place_pinned([agent("a", slots=2, free=1)], ["a", "a"], 0)
    assert isinstance(busy, NoFit) and "waiting for capacity on agent a (worker 1" in busy.reason


def test_an_offline_or_unknown_agent_is_named_in_the_reason() -> None:
    placed = place_pinned([agent("a")], ["a", "gone", "ghost"], 0)
    assert isinstance(placed, NoFit)
    assert "ghost, gone are offline or unknown" in placed.reason


def test_a_busy_agent_and_a_wrong_device_kind_are_explained() -> None:
    busy = place_pinned([agent("a", free=0), agent("b")], ["b", "a"], 0)
    assert isinstance(busy, NoFit) and "agent a" in busy.reason and "worker 1" in busy.reason
    kind = place_pinned([agent("a")], ["a"], 1)
    assert isinstance(kind, NoFit) and "GPUs" in kind.reason


def test_the_spec_needs_one_agent_per_worker() -> None:
    spec = JobCreate(bundle_digest=DIGEST, command=["python", "x.py"], workers=2, agents=["a", "b"])
    assert spec.agents == ["a", "b"]
    with pytest.raises(ValidationError, match="one per worker"):
        JobCreate(bundle_digest=DIGEST, command=["python", "x.py"], workers=2, agents=["a"])
    with pytest.raises(ValidationError):
        JobCreate(bundle_digest=DIGEST, command=["python", "x.py"], workers=1, agents=["x" * 201])

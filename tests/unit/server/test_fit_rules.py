"""One rule for "could this gang ever fit": the refusal at submit (over registered agents) and the reason a
waiting job gets (over online agents) agree on every shape, because both ask services/scheduler/fit_rules.py."""

from __future__ import annotations

import itertools

from mwms.server.services.scheduler.fit_rules import AgentShape, Rule, never_fits
from mwms.server.services.scheduler.placement import AgentCapacity
from mwms.server.services.scheduler.placement import never_fits as waiting_misfit
from mwms.server.services.scheduler.submit_capacity import RegisteredAgent, impossible_reason

GiB = 1024**3
CLUSTER = [
    ("g8", "gpu", 8, 512 * GiB),
    ("g4", "gpu", 4, 0),  # did not report its memory: taken to hold any
    ("c2", "cpu", 2, 16 * GiB),
    ("c1", "cpu", 1, 6 * GiB),
]


def test_the_submit_refusal_and_the_waiting_reason_agree_on_every_shape() -> None:
    registered = [
        RegisteredAgent(f"id-{n}", n, kind, devices, memory) for n, kind, devices, memory in CLUSTER
    ]
    online = [
        AgentCapacity(
            f"id-{n}", n, "10.0.0.1", kind, tuple(range(d)), tuple(range(d)), 20000, 20099, memory_bytes=m
        )
        for n, kind, d, m in CLUSTER
    ]
    shapes = itertools.product(
        (1, 2, 3, 4, 5, 13), (0, 1, 4, 8, 9), (0, 4 * GiB, 8 * GiB, 100 * GiB, 600 * GiB)
    )
    refused = 0
    for workers, gpus, memory in shapes:
        at_submit = impossible_reason(registered, workers, gpus, None, memory_per_worker=memory)
        waiting = waiting_misfit(online, workers, gpus, memory)
        assert (at_submit is None) == (waiting is None), (workers, gpus, memory, at_submit, waiting)
        refused += at_submit is not None
    assert refused > 20  # the shapes reach every rule, not only the fitting ones


def test_each_rule_is_named_with_the_figures_a_reason_quotes() -> None:
    agents = [AgentShape(n, kind, devices, memory) for n, kind, devices, memory in CLUSTER]
    assert never_fits(agents, 1, 2) is None
    assert never_fits(agents[2:], 1, 1).rule is Rule.NO_AGENT_OF_KIND  # type: ignore[union-attr]
    too_big = never_fits(agents, 1, 9)
    assert too_big is not None and too_big.rule is Rule.DEVICES_PER_AGENT and too_big.largest == agents[0]
    too_many = never_fits(agents, 4, 0)
    assert too_many is not None and (too_many.rule, too_many.most) == (Rule.DEVICES_IN_ALL, 3)
    roomy = never_fits(agents[2:], 1, 0, 32 * GiB)
    assert roomy is not None and roomy.rule is Rule.MEMORY_PER_AGENT and roomy.largest == agents[2]
    memory = never_fits(agents[2:], 3, 0, 8 * GiB)
    assert memory is not None and (memory.rule, memory.most) == (Rule.MEMORY_IN_ALL, 2)
    # An agent that did not report its memory holds any: only its devices count.
    assert never_fits(agents[:2], 1, 4, 600 * GiB) is None

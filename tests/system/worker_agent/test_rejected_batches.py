"""The agent and the metrics contract: a NaN written by Python's json.dumps reaches the coordinator as NaN, and
points the coordinator refused (acknowledged with a reason) are dropped and logged, never sent again."""

from __future__ import annotations

import math
import textwrap

from mwms.v1 import agent_pb2
from mwms_testkit.agent_builders import connected, start_task
from mwms_testkit.cluster import pack

WRITES_NAN = textwrap.dedent(
    """
    import json, os, time
    with open(os.environ["MWMS_METRICS_FILE"], "a") as metrics:
        metrics.write(json.dumps({"name": "loss", "step": 1, "value": 0.5, "time": time.time()}) + "\\n")
        metrics.write(json.dumps({"name": "loss", "step": 2, "value": float("nan"), "time": time.time()}) + "\\n")
        metrics.write(json.dumps({"name": "loss", "step": 3, "value": 1.0, "time": 1e18}) + "\\n")
        metrics.write(json.dumps({"name": "loss", "step": 4, "value": "-Infinity", "time": time.time()}) + "\\n")
    time.sleep(0.5)
    """
)


def test_refused_points_are_dropped_and_logged_not_resent(coordinator, start_agent, wait_for) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    fake.auto_ack = False
    agent = start_agent(address)
    stream = connected(fake, wait_for)
    digest = fake.add_bundle(pack({"train.py": WRITES_NAN}))
    stream.send(start=start_task("task-nan", digest))

    def points() -> list[agent_pb2.MetricPoint]:
        return [p for batch in stream.of_kind("metrics") for p in batch.points]

    wait_for(lambda: len(points()) >= 3, "the metric points", observed=points)
    sent = points()
    assert [(p.seq, p.step) for p in sent] == [(1, 1), (2, 2), (4, 4)]  # line 3's time is out of range
    assert math.isnan(sent[1].value) and sent[2].value == -math.inf

    # The coordinator stores 1 and 4 and refuses 2 (say): one cumulative ack with the refusal.
    stream.send(
        ack=agent_pb2.Ack(task_id="task-nan", metric_seq=4, rejected=1, reject_reason="seq 2: a test refusal")
    )

    def agent_notes() -> list[str]:
        return [line.text for line in fake.log_lines("task-nan") if line.text.startswith("mwms-agent:")]

    wait_for(
        lambda: any("refused 1 metric point(s): seq 2: a test refusal" in t for t in agent_notes()),
        "the note",
    )
    assert any("skipped metrics line 3" in t and "time" in t for t in agent_notes()), agent_notes()

    stream.close()
    second = connected(fake, wait_for, count=2)
    wait_for(lambda: len(second.of_kind("heartbeat")) >= 3, "a settled second session")
    assert second.of_kind("metrics") == []  # acknowledged, refused or not: never resent
    assert second.of_kind("logs")  # the unacknowledged log lines are, as before
    assert agent.shut_down() == 0

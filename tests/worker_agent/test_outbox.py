"""The outbox keeps items until a cumulative ack and hands out what is left to (re)send."""

from __future__ import annotations

from mwms.v1 import agent_pb2
from worker_agent.outbox import Outbox


def lines(*seqs: int) -> list[agent_pb2.LogLine]:
    return [agent_pb2.LogLine(seq=seq, text=f"line {seq}") for seq in seqs]


def test_ack_is_cumulative_and_unacked_resends_the_rest() -> None:
    outbox: Outbox[agent_pb2.LogLine] = Outbox()
    for line in lines(1, 2, 3, 4, 5):
        outbox.add(line)
    assert [item.seq for item in outbox.unacked(after=3)] == [
        4,
        5,
    ]  # what a running session still has to send
    outbox.ack(2)
    # After a reconnect everything not acknowledged goes out again.
    assert [item.seq for item in outbox.unacked()] == [3, 4, 5]
    assert [item.seq for item in outbox.unacked(limit=2)] == [3, 4]
    outbox.ack(1)  # an older ack changes nothing
    assert len(outbox) == 3
    outbox.ack(5)
    assert outbox.unacked() == []


def test_items_at_or_below_the_acked_seq_are_not_stored_again() -> None:
    outbox: Outbox[agent_pb2.LogLine] = Outbox()
    outbox.ack(3)
    for line in lines(2, 3, 4):
        outbox.add(line)
    assert [item.seq for item in outbox.unacked()] == [4]


def test_memory_is_bounded_by_dropping_the_oldest() -> None:
    outbox: Outbox[agent_pb2.LogLine] = Outbox(max_items=3)
    for line in lines(1, 2, 3, 4, 5):
        outbox.add(line)
    assert [item.seq for item in outbox.unacked()] == [3, 4, 5]
    assert outbox.dropped == 2

"""The on-disk outbox: cumulative acks, resends, persistence across instances, seq reuse, the byte bound."""

from __future__ import annotations

import json
from pathlib import Path

from mwms.v1 import agent_pb2
from mwms.worker_agent.outbox import Outbox


def lines(*seqs: int, text: str = "line") -> list[agent_pb2.LogLine]:
    return [
        agent_pb2.LogLine(seq=seq, stream="stdout", text=f"{text} {seq}", unix_ms=1000 + seq) for seq in seqs
    ]


def log_outbox(directory: Path, **kwargs: int) -> Outbox[agent_pb2.LogLine]:
    return Outbox(directory, "logs", agent_pb2.LogLine, **kwargs)


def test_ack_is_cumulative_and_unacked_resends_the_rest(tmp_path: Path) -> None:
    outbox = log_outbox(tmp_path)
    for line in lines(1, 2, 3, 4, 5):
        outbox.add(line)
    # What a running session still has to send after seq 3.
    assert [item.seq for item in outbox.unacked(after=3)] == [4, 5]
    outbox.ack(2)
    # After a reconnect everything not acknowledged goes out again, unchanged.
    assert outbox.unacked() == lines(3, 4, 5)
    assert [item.seq for item in outbox.unacked(limit=2)] == [3, 4]
    outbox.ack(1)  # an older ack changes nothing
    assert len(outbox) == 3
    outbox.ack(5)
    assert outbox.unacked() == [] and len(outbox) == 0


def test_a_seq_is_never_stored_twice(tmp_path: Path) -> None:
    outbox = log_outbox(tmp_path)
    outbox.ack(3)
    for line in lines(2, 3, 4):
        outbox.add(line)
    assert [item.seq for item in outbox.unacked()] == [4]
    # A different line under a seq already used is refused.
    outbox.add(agent_pb2.LogLine(seq=4, text="impostor"))
    assert [item.text for item in outbox.unacked()] == ["line 4"]


def test_unacked_items_and_the_ack_cursor_survive_a_new_instance(tmp_path: Path) -> None:
    first = log_outbox(tmp_path)
    for line in lines(1, 2, 3, 4):
        first.add(line)
    first.ack(2)
    assert first.unacked(after=2) == lines(3, 4)  # handed out, so flushed to disk
    first.add(lines(5)[0])  # still in the write buffer when the "agent" dies
    # No close(): the process died. A new agent process opens the same files.
    second = log_outbox(tmp_path)
    assert [item.seq for item in second.unacked()] == [3, 4]
    assert second.last_seq == 4  # seq 5 was never sent, so it may be used again
    assert json.loads((tmp_path / "logs.cursor.json").read_text())["acked_seq"] == 2
    second.add(agent_pb2.LogLine(seq=5, text="after restart"))
    second.ack(4)
    second.close()
    third = log_outbox(tmp_path)
    assert [(item.seq, item.text) for item in third.unacked()] == [(5, "after restart")]
    assert third.last_seq == 5


def test_a_line_cut_by_a_crash_is_discarded(tmp_path: Path) -> None:
    outbox = log_outbox(tmp_path)
    for line in lines(1, 2):
        outbox.add(line)
    outbox.close()
    with (tmp_path / "logs.jsonl").open("ab") as spool:
        spool.write(b'{"seq":3,"text":"half a li')
    reopened = log_outbox(tmp_path)
    assert [item.seq for item in reopened.unacked()] == [1, 2]
    reopened.add(lines(3)[0])
    reopened.close()
    assert [item.seq for item in log_outbox(tmp_path).unacked()] == [1, 2, 3]


def test_the_bound_drops_the_oldest_and_says_how_many(tmp_path: Path) -> None:
    size = (
        len(
            json.dumps(
                {"seq": 10, "stream": "stdout", "text": "x" * 90 + " 10", "unix_ms": 1010},
                separators=(",", ":"),
            )
        )
        + 1
    )
    outbox = log_outbox(tmp_path, max_bytes=10 * size)
    dropped = [outbox.add(line) for line in lines(*range(10, 21), text="x" * 90)]
    # The 11th line crosses the bound: the oldest go until 7/8 of it is left.
    assert dropped[:10] == [0] * 10
    assert dropped[10] == 3 and outbox.dropped == 3
    assert [item.seq for item in outbox.unacked()] == list(range(13, 21))
    # Dropped lines do not come back in a new instance, and their seqs stay used.
    outbox.close()
    again = log_outbox(tmp_path, max_bytes=10 * size)
    assert [item.seq for item in again.unacked()] == list(range(13, 21))
    assert again.dropped == 3 and again.last_seq == 20


def test_the_spool_is_compacted_once_mostly_acknowledged(tmp_path: Path) -> None:
    outbox = log_outbox(tmp_path)
    text = "y" * 1000
    for line in lines(*range(1, 3001), text=text):
        outbox.add(line)
    outbox.unacked(limit=1)
    big = (tmp_path / "logs.jsonl").stat().st_size
    outbox.ack(2990)
    assert (tmp_path / "logs.jsonl").stat().st_size < big / 100
    assert [item.seq for item in outbox.unacked()] == list(range(2991, 3001))
    outbox.close()
    assert [item.seq for item in log_outbox(tmp_path).unacked()] == list(range(2991, 3001))


def test_unacked_stops_at_max_bytes_as_spooled_but_hands_out_one_item_whatever_its_size(
    tmp_path: Path,
) -> None:
    outbox = log_outbox(tmp_path)
    for line in lines(1, 2, 3, 4, 5):
        outbox.add(line)
    outbox.unacked(limit=1)  # flushes the writer: the spool's size is on disk now
    one = (tmp_path / "logs.jsonl").stat().st_size // 5  # every line here spools to the same size
    assert [x.seq for x in outbox.unacked(max_bytes=2 * one)] == [1, 2]
    assert [x.seq for x in outbox.unacked(max_bytes=2 * one + one - 1)] == [1, 2]
    assert [x.seq for x in outbox.unacked(max_bytes=5 * one)] == [1, 2, 3, 4, 5]
    assert [x.seq for x in outbox.unacked(after=3, max_bytes=10 * one)] == [4, 5]
    assert [x.seq for x in outbox.unacked(max_bytes=1)] == [1]  # never stuck behind one big item
    assert [x.seq for x in outbox.unacked(max_bytes=10 * one, limit=3)] == [1, 2, 3]
    # Items still in the write buffer count too.
    outbox.add(lines(6)[0])
    assert [x.seq for x in outbox.unacked(after=4, max_bytes=2 * one)] == [5, 6]


def test_a_batch_within_max_bytes_is_never_bigger_on_the_wire(tmp_path: Path) -> None:
    outbox = log_outbox(tmp_path)
    # What serializes bigger per character in protobuf than in plain text: non-ASCII (3 bytes in UTF-8).
    texts = ["x" * 65536, "\ufffd" * 65536, "é" * 40000 + '\t"\\', "🙂" * 20000]
    for seq, text in enumerate(texts * 3, start=1):
        outbox.add(
            agent_pb2.LogLine(seq=seq, stream="stderr", text=text, unix_ms=2**40, replaces_seq=seq - 1)
        )
    budget = 300 * 1024
    after = 0
    while items := outbox.unacked(after=after, max_bytes=budget):
        wire = agent_pb2.LogBatch(task_id="t" * 32, lines=items).ByteSize()
        assert len(items) == 1 or wire <= budget, (len(items), wire)
        after = items[-1].seq
    assert after == 12

"""A stack dump's snapshots (mwms/stack_dumps.py) and the verdict over them (server/services/observing/stack_text.py):
a worker is "not in a collective" only when it is outside one in every snapshot."""

from __future__ import annotations

import pytest

from mwms import stack_dumps
from mwms.server.services.observing.stack_text import dump_in_collective, read_dump

# py-spy's shape: a main thread between two steps of `fit` (in a callback), and one inside the train function.
BETWEEN_STEPS = """Thread 101 (idle): "MainThread"
    on_train_batch_end (callbacks.py:12)
    fit (training.py:1800)
    <module> (train.py:30)
"""
IN_STEP = """Thread 101 (active): "MainThread"
    quick_execute (tensorflow/python/eager/execute.py:53)
    _call_flat (tensorflow/python/eager/polymorphic_function/concrete_function.py:1323)
    fit (training.py:1790)
    <module> (train.py:30)
"""


def test_snapshots_round_trip_with_their_offsets() -> None:
    text = stack_dumps.join_snapshots([BETWEEN_STEPS, IN_STEP, ""], [0.0, 0.5123, 1.0])
    assert text.splitlines()[0] == "=== mwms snapshot 1 of 3 at +0.000 s ==="
    assert "=== mwms snapshot 2 of 3 at +0.512 s ===" in text
    assert stack_dumps.split_snapshots(text) == [BETWEEN_STEPS.rstrip(), IN_STEP.rstrip(), ""]
    with pytest.raises(ValueError, match="one offset per snapshot"):
        stack_dumps.join_snapshots([IN_STEP], [])


def test_a_text_without_markers_is_one_snapshot_and_an_empty_one_none() -> None:
    assert stack_dumps.split_snapshots(IN_STEP) == [IN_STEP]
    assert stack_dumps.split_snapshots("  \n") == []


def test_a_text_claiming_more_snapshots_than_the_bound_is_read_up_to_it() -> None:
    many = stack_dumps.MAX_SNAPSHOTS + 5
    text = stack_dumps.join_snapshots([BETWEEN_STEPS] * many, [i * 0.1 for i in range(many)])
    assert len(stack_dumps.split_snapshots(text)) == stack_dumps.MAX_SNAPSHOTS


def test_one_snapshot_between_two_collectives_does_not_make_a_worker_outside() -> None:
    reading = read_dump(stack_dumps.join_snapshots([BETWEEN_STEPS, IN_STEP, BETWEEN_STEPS], [0, 0.5, 1]))
    assert (reading.snapshots, reading.snapshots_in_collective, reading.in_collective) == (3, 1, True)
    # The threads shown are those of a snapshot that agrees with the verdict.
    assert reading.threads[0].in_collective and "quick_execute" in reading.threads[0].frames[0]


def test_outside_in_every_snapshot_is_outside() -> None:
    reading = read_dump(stack_dumps.join_snapshots([BETWEEN_STEPS] * 3, [0, 0.5, 1]))
    assert (reading.snapshots, reading.snapshots_in_collective, reading.in_collective) == (3, 0, False)
    assert "on_train_batch_end" in reading.threads[0].frames[0]


def test_an_older_agents_single_dump_and_a_dump_without_threads() -> None:
    assert (read_dump(IN_STEP).snapshots, dump_in_collective(IN_STEP)) == (1, True)
    assert dump_in_collective(BETWEEN_STEPS) is False
    empty = read_dump("no threads here")
    assert (empty.snapshots, empty.in_collective, empty.threads) == (0, None, [])

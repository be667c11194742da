"""The collective rule over real dumps: 2-worker MWMS jobs (TF 2.21, CPU; a custom loop, and model.fit with
a callback) whose worker 1 sleeps while worker 0 waits, taken with py-spy and with the agent's faulthandler
handler (testkit/mwms_testkit/stack_dumps)."""

from __future__ import annotations

import pytest

from mwms.server.services.observing.stack_text import (
    dump_in_collective,
    main_thread_frame,
    parse_threads,
    waits_in_collective,
)
from mwms_testkit import STACK_DUMPS

DUMPS = STACK_DUMPS


def dump(name: str) -> str:
    return (DUMPS / name).read_text()


@pytest.mark.parametrize(
    ("name", "in_collective"),
    [
        # The first step: worker 0's replica thread broadcasts the optimizer's new variables.
        ("py_spy_worker0_first_step_in_broadcast.txt", True),
        # A later step: worker 0 waits in the tf.function call, where the step's all-reduce runs.
        ("py_spy_worker0_step_in_tf_function.txt", True),
        ("faulthandler_worker0_step_in_tf_function.txt", True),
        # model.fit: worker 0 waits in the train function, worker 1 sleeps in a callback.
        ("py_spy_worker0_keras_fit.txt", True),
        ("faulthandler_worker0_keras_fit.txt", True),
        ("py_spy_worker1_keras_callback_sleeping.txt", False),
        ("faulthandler_worker1_keras_callback_sleeping.txt", False),
        # Worker 1 sleeps before its all-reduce, in Python.
        ("py_spy_worker1_sleeping.txt", False),
        ("py_spy_worker1_sleeping_after_steps.txt", False),
        ("faulthandler_worker1_sleeping.txt", False),
    ],
)
def test_real_dumps_are_classified(name: str, in_collective: bool) -> None:
    assert dump_in_collective(dump(name)) is in_collective


def test_py_spy_threads_and_frames_innermost_first() -> None:
    threads = parse_threads(dump("py_spy_worker0_first_step_in_broadcast.txt"))
    assert [t.title.split(" ")[0] for t in threads] == ["MainThread", "Thread-1"]
    main, replica = threads
    assert main.frames[0] == "Condition.wait (threading.py:327)"
    assert main.frames[-1] == "<module> (prog.py:30)"
    assert not main.in_collective  # it waits for the replica thread, which is the one in the collective
    assert replica.in_collective and replica.frames[0].startswith("quick_execute")
    assert main_thread_frame(threads) == "Condition.wait (threading.py:327)"


def test_faulthandler_threads_and_frames() -> None:
    threads = parse_threads(dump("faulthandler_worker1_sleeping.txt"))
    assert len(threads) == 1 and threads[0].title.endswith("(current)")
    assert threads[0].frames[0].endswith("line 24 in wait_before_first_allreduce")
    assert "wait_before_first_allreduce" in main_thread_frame(threads)


def test_a_collection_under_way_is_not_where_the_thread_is() -> None:
    text = dump("faulthandler_worker1_sleeping.txt").replace(
        "(most recent call first):\n", "(most recent call first):\n  Garbage-collecting\n", 1
    )
    threads = parse_threads(text)
    assert threads[0].frames[0] == "Garbage-collecting"
    assert "wait_before_first_allreduce" in main_thread_frame(threads)


def test_the_health_check_thread_is_no_wait() -> None:
    frames = [
        "CollectiveAllReduceExtended._check_health (tensorflow/python/distribute/collective_all_reduce_strategy.py:950)",
        "Thread.run (threading.py:982)",
    ]
    assert not waits_in_collective(frames)
    assert waits_in_collective(["all_reduce_v2 (tensorflow/python/ops/collective_ops.py:80)"])
    assert not waits_in_collective(["time.sleep", "input_pipeline (train.py:3)"])


def test_a_dump_without_threads_cannot_tell() -> None:
    assert dump_in_collective("") is None
    assert dump_in_collective("Process 1: python\nPython v3.11\n") is None

"""A warm task's stacks show its program's frames alone (worker_agent/stacks.py without_warm_frames)."""

from __future__ import annotations

from mwms.worker_agent import stacks, warm_pool


def test_faulthandler_and_py_spy_frames_of_the_warm_interpreter_are_left_out():
    faulthandler = (
        "Thread 0x00007f (most recent call first):\n"
        '  File "/job/bundle/train.py", line 9 in <module>\n'
        f'  File "{warm_pool.INTERPRETER}", line 80 in _run_as_main\n'
        f'  File "{warm_pool.INTERPRETER}", line 101 in main\n'
    )
    assert stacks.without_warm_frames(faulthandler) == (
        'Thread 0x00007f (most recent call first):\n  File "/job/bundle/train.py", line 9 in <module>\n'
    )
    py_spy = (
        'Thread 2 (idle): "MainThread"\n'
        "    <module> (train.py:9)\n"
        "    _run_as_main (worker_agent/warm_interpreter.py:80)\n"
    )
    assert stacks.without_warm_frames(py_spy) == 'Thread 2 (idle): "MainThread"\n    <module> (train.py:9)\n'


def test_a_cold_tasks_stacks_are_unchanged():
    text = 'Thread 1:\n  File "/job/bundle/warm.py", line 3 in <module>\n'
    assert stacks.without_warm_frames(text) == text

"""Reading a stack dump as the agents send it (py-spy's or faulthandler's text): its threads and their
frames, innermost first, and whether the process waits inside a TensorFlow collective.

The rule (`waits_in_collective`) is one function over one thread's frames: a thread waits in a collective
when one of its frames is TensorFlow's collective machinery (the collective ops, the cross-device
all-reduce, the collective strategy: where the first step of MWMS waits, while its variables are
broadcast), or when it waits for TensorFlow to execute ops (a tf.function call, `model.fit`'s train
function, an eager op): that is where every later step's all-reduce runs, and Python frames cannot tell
a collective that waits for a missing worker from a long computation. A thread sleeping, reading input or
computing in Python is not in a collective. MWMS's peer health-check thread, which always sits in the
collective strategy's code, does not count.

A dump holds several snapshots spaced apart (mwms/stack_dumps.py). A worker is in a collective when it is
in one in some snapshot, and "not in a collective" only when it is outside one in all of them: a healthy
loop is caught between two collectives in one snapshot often enough, a worker stuck in its own code in
every one. `read_dump` gives the verdict, how many snapshots said what, and which snapshot to show.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mwms.stack_dumps import split_snapshots

# Frames of TensorFlow's collective machinery: the ops, the cross-device all-reduce, the strategy's own.
_COLLECTIVE_FRAME = re.compile(
    r"collective_ops|cross_device_ops|cross_device_utils|collective_all_reduce_strategy|nccl_ops"
    r"|\ball_reduce|batch_all_reduce|all_gather|broadcast_send|broadcast_recv|CollectiveReduce"
    r"|CollectiveGather|CollectiveBcast"
)
# Frames of a thread that waits for TensorFlow to finish executing ops (a tf.function call, an eager op,
# waiting for the async executor).
_EXECUTING_FRAME = re.compile(
    r"\bquick_execute\b|\b_call_flat\b|execute\.py|async_wait|\bsync\b.*context\.py"
)
# MWMS's health check of its peers: always in the collective strategy's code, never a sign of a wait.
_HEALTH_CHECK_FRAME = re.compile(r"_check_health")
# The line faulthandler prints above the current thread's frames while a garbage collection runs.
_GC_LINE = "Garbage-collecting"
_PY_SPY_THREAD = re.compile(r'^Thread (\S+) \(([^)]*)\)(?::\s*"(.*)")?\s*$')
_FAULTHANDLER_THREAD = re.compile(
    r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):\s*$"
)


@dataclass
class ThreadStack:
    """One thread of a dump: its title as the tool printed it, and its frames, innermost first."""

    title: str
    frames: list[str] = field(default_factory=list)

    @property
    def in_collective(self) -> bool:
        return waits_in_collective(self.frames)


def parse_threads(text: str) -> list[ThreadStack]:
    """The threads of a py-spy or faulthandler dump, in the order printed, frames innermost first."""
    threads: list[ThreadStack] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip():
            continue
        py_spy = _PY_SPY_THREAD.match(line)
        faulthandler = _FAULTHANDLER_THREAD.match(line)
        if py_spy:
            ident, status, name = py_spy.groups()
            title = f"{name} (thread {ident}, {status})" if name else f"thread {ident} ({status})"
            threads.append(ThreadStack(title))
        elif faulthandler:
            current, ident = faulthandler.groups()
            threads.append(
                ThreadStack(f"thread {ident}" + (" (current)" if current.startswith("Current") else ""))
            )
        elif threads and raw[:1].isspace():
            threads[-1].frames.append(line.strip())
    return threads


def waits_in_collective(frames: list[str]) -> bool:
    """Whether a thread with these frames (innermost first) waits inside a TensorFlow collective."""
    if any(_HEALTH_CHECK_FRAME.search(frame) for frame in frames):
        return False
    return any(_COLLECTIVE_FRAME.search(frame) or _EXECUTING_FRAME.search(frame) for frame in frames)


@dataclass(frozen=True)
class DumpReading:
    """What a dump's snapshots say: how many had threads, in how many some thread waited in a collective,
    and the threads of the snapshot to show (the newest that agrees with the verdict)."""

    snapshots: int
    snapshots_in_collective: int
    threads: list[ThreadStack]

    @property
    def in_collective(self) -> bool | None:
        """In a collective in some snapshot; False only when outside in every one; None without threads."""
        return None if not self.snapshots else self.snapshots_in_collective > 0


def read_dump(text: str) -> DumpReading:
    """The verdict over a dump's snapshots (a text without snapshot markers is one snapshot)."""
    readings = [parse_threads(part) for part in split_snapshots(text)]
    readings = [threads for threads in readings if threads]
    inside = [threads for threads in readings if any(thread.in_collective for thread in threads)]
    shown = inside[-1] if inside else (readings[-1] if readings else [])
    return DumpReading(len(readings), len(inside), shown)


def dump_in_collective(text: str) -> bool | None:
    """Whether the dump's worker waits in a collective in some snapshot; None for a dump without threads."""
    return read_dump(text).in_collective


def main_thread_frame(threads: list[ThreadStack]) -> str:
    """The innermost frame of the main thread (py-spy's "MainThread", faulthandler's current thread,
    which runs the signal handler), for a one-line "where is it"; empty when unknown. faulthandler's
    "Garbage-collecting" line (a collection was under way when the signal came) is no frame: the one
    under it is where the thread is."""
    code_frames = [[f for f in thread.frames if f != _GC_LINE] for thread in threads]
    for thread, frames in zip(threads, code_frames, strict=True):
        if frames and ("MainThread" in thread.title or thread.title.endswith("(current)")):
            return frames[0]
    return next((frames[0] for frames in code_frames if frames), "")

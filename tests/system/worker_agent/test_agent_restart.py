"""An agent that dies (SIGKILL) leaves its tasks running; the next agent on the same work dir stops them,
reports them FAILED in its first Hello and resends what the coordinator had not acknowledged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from mwms.v1 import agent_pb2
from mwms.worker_agent import agent_state
from mwms_testkit.cluster import pack
from mwms_testkit.parallel import port_range

S = agent_pb2
MWMS = Path(sys.executable).with_name("mwms")

# Two lines, then (once the test creates "go") a third line and a metric, then waits to be stopped.
LONG_TASK = textwrap.dedent(
    """
    import json, os, time
    print("line 1", flush=True)
    print("line 2", flush=True)
    go = os.path.join(os.environ["MWMS_OUTPUT_DIR"], "..", "go")
    while not os.path.exists(go):
        time.sleep(0.02)
    print("line 3", flush=True)
    with open(os.environ["MWMS_METRICS_FILE"], "a") as metrics:
        metrics.write(json.dumps({"name": "loss", "step": 1, "value": 0.25}) + "\\n")
    time.sleep(120)
    """
)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def running_entry(task_id: str, task_index: int, pid: int, start_ticks: int) -> dict[str, object]:
    """A RUNNING task of job-1 in the task table a previous agent process left, as process group `pid`."""
    return dict(
        task_id=task_id,
        job_id="job-1",
        attempt=1,
        task_index=task_index,
        state=S.TASK_STATE_RUNNING,
        pid=pid,
        pgid=pid,
        start_ticks=start_ticks,
        boot_id=agent_state.boot_id(),
    )


def test_a_restarted_agent_stops_the_orphans_reports_them_and_resends_unacked_lines(
    coordinator, start_agent, wait_for, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    work_dir = tmp_path / "agent"
    first_agent = subprocess.Popen(
        [str(MWMS), "agent", "--server", address, "--name", "node-a", "--work-dir", str(work_dir)]
        + ["--slots", "1", "--port-range", port_range(21000, 11)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: fake.streams and fake.streams[0].of_kind("hello"), "the first agent's Hello")
        first = fake.streams[0]
        digest = fake.add_bundle(pack({"train.py": LONG_TASK}))
        start = agent_pb2.StartTask(
            task_id="task-orphan",
            job_id="job-1",
            attempt=1,
            task_index=0,
            num_workers=1,
            bundle_digest=digest,
            command=["python", "train.py"],
            device_kind=S.DEVICE_KIND_CPU_SLOT,
            device_indices=[0],
        )
        first.send(start=start)
        wait_for(lambda: len(fake.log_lines("task-orphan")) == 2, "two lines (acknowledged)")
        wait_for(lambda: len(first.of_kind("heartbeat")) >= 3, "the acks to arrive")
        # From here on nothing is acknowledged: line 3 and the metric stay in the outbox on disk.
        fake.auto_ack = False
        (work_dir / "jobs/job-1/attempt-1/task-0/go").touch()
        wait_for(lambda: len(fake.log_lines("task-orphan")) == 3, "line 3")
        wait_for(lambda: first.of_kind("metrics"), "the metric point")
        pid = [r.pid for r in fake.reports("task-orphan") if r.state == S.TASK_STATE_RUNNING][0]
        table = json.loads((work_dir / "agent-state.json").read_text())["tasks"]
        assert [(t["task_id"], t["state"], t["pgid"]) for t in table] == [
            ("task-orphan", S.TASK_STATE_RUNNING, pid)
        ]
    finally:
        first_agent.send_signal(signal.SIGKILL)
        first_agent.wait(10)
    assert alive(pid), "the task should outlive a killed agent (it runs in its own session)"

    fake.auto_ack = False
    second_agent = start_agent(address, work_dir=work_dir, stop_grace=2.0)
    wait_for(lambda: len(fake.streams) >= 2 and fake.streams[1].of_kind("hello"), "the new agent's Hello")
    second = fake.streams[1]
    assert not alive(pid), "the orphan must be stopped before the new agent's Hello"
    hello = second.of_kind("hello")[0]
    # Listed as RUNNING while its last lines are unsent; the final report follows them.
    assert [(t.task_id, t.state) for t in hello.tasks] == [("task-orphan", S.TASK_STATE_RUNNING)]
    wait_for(lambda: second.of_kind("task"), "the final report after the resent lines")
    assert [(t.task_id, t.state, t.exit_code, t.message) for t in second.of_kind("task")][:1] == [
        (
            "task-orphan",
            S.TASK_STATE_FAILED,
            137,
            "the agent restarted while this task was running; its process was stopped",
        )
    ]
    order = [m.WhichOneof("body") for m in second.received if m.WhichOneof("body") in ("logs", "task")]
    assert order.index("logs") < order.index("task"), order
    # The unacknowledged line comes again under its seq, then the agent's note; acked lines do not.
    wait_for(lambda: len(fake.log_lines("task-orphan", second)) == 2, "the resent lines")
    resent = [(line.seq, line.stream, line.text) for line in fake.log_lines("task-orphan", second)]
    assert resent == [
        (3, "stdout", "line 3"),
        (4, "stderr", "mwms-agent: the agent restarted while this task was running; its process was stopped"),
    ]
    wait_for(lambda: second.of_kind("metrics"), "the resent metric point")
    assert [(p.seq, p.name, p.value) for b in second.of_kind("metrics") for p in b.points] == [
        (1, "loss", 0.25)
    ]

    # Once everything is acknowledged the task is forgotten, on disk too.
    second.send(ack=agent_pb2.Ack(task_id="task-orphan", log_seq=4, metric_seq=1, final_state=True))
    wait_for(lambda: not (work_dir / "outbox" / "task-orphan").exists(), "the outbox to be removed")
    wait_for(
        lambda: json.loads((work_dir / "agent-state.json").read_text())["tasks"] == [],
        "an empty task table",
    )
    assert second_agent.shut_down() == 0


def test_a_task_that_ended_while_no_agent_ran_is_reported_with_an_unknown_exit_code(
    coordinator, start_agent, wait_for, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    work_dir = tmp_path / "agent"
    work_dir.mkdir()
    # A process that already ended: its group is gone (pid of an exited child), same boot.
    gone = subprocess.Popen(["true"])
    gone.wait()
    table = {
        "version": 1,
        "tasks": [
            running_entry("task-gone", 1, gone.pid, start_ticks=1),
            dict(
                task_id="task-done",
                job_id="job-1",
                attempt=1,
                task_index=2,
                state=S.TASK_STATE_SUCCEEDED,
                pid=4242,
                pgid=4242,
                exit_code=0,
                message="exited with code 0",
            ),
            dict(
                task_id="task-acked",
                job_id="job-1",
                attempt=1,
                task_index=3,
                state=S.TASK_STATE_FAILED,
                exit_code=1,
                final_acked=True,
            ),
        ],
    }
    (work_dir / "agent-state.json").write_text(json.dumps(table))
    start_agent(address, work_dir=work_dir)
    wait_for(lambda: fake.streams and fake.streams[0].of_kind("hello"), "the Hello")
    stream = fake.streams[0]
    hello = stream.of_kind("hello")[0]
    assert sorted(t.task_id for t in hello.tasks) == ["task-done", "task-gone"]

    def finals() -> dict[str, tuple[int, int]]:
        # In the Hello when nothing of the task is unsent, else in a report after its resent lines.
        reports = [t for t in hello.tasks if t.state != S.TASK_STATE_RUNNING] + stream.of_kind("task")
        return {r.task_id: (r.state, r.exit_code) for r in reports}

    wait_for(lambda: len(finals()) == 2, "both final states", observed=finals)
    assert finals() == {"task-done": (S.TASK_STATE_SUCCEEDED, 0), "task-gone": (S.TASK_STATE_FAILED, -1)}
    assert os.path.exists(work_dir / "agent-state.json")


def test_a_restarted_agent_beats_while_an_orphan_outlives_its_sigterm_and_says_hello_once_it_is_gone(
    coordinator, start_agent, wait_for, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """Found in CI: the next agent process stopped the orphans before it even registered, so an orphan that
    ignored SIGTERM kept it silent for the whole stop grace, and the coordinator declared the agent lost."""
    fake, address = coordinator
    work_dir = tmp_path / "agent"
    work_dir.mkdir()
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)",
        ],
        start_new_session=True,
    )
    try:
        entry = running_entry(
            "task-stubborn", 0, stubborn.pid, start_ticks=agent_state.process_start_ticks(stubborn.pid)
        )
        (work_dir / "agent-state.json").write_text(json.dumps({"version": 1, "tasks": [entry]}))
        start_agent(address, work_dir=work_dir, stop_grace=3.0)

        # It is on a stream and beating while the orphan still ignores the SIGTERM it was sent...
        wait_for(lambda: fake.streams and len(fake.streams[0].of_kind("heartbeat")) >= 2, "heartbeats")
        stream = fake.streams[0]
        assert alive(stubborn.pid), "the orphan ignores SIGTERM until the grace ends"
        assert not stream.of_kind("hello"), "no Hello (and so no command) while an orphan is being stopped"

        # ...and says hello once the SIGKILL after the grace has ended it, reporting how it ended.
        wait_for(lambda: stream.of_kind("hello"), "the Hello", timeout=15)
        assert stubborn.wait(5) == -signal.SIGKILL
        hello = stream.of_kind("hello")[0]
        reports = [t for t in hello.tasks if t.state != S.TASK_STATE_RUNNING]
        wait_for(lambda: reports or stream.of_kind("task"), "the final report")
        final = (reports or stream.of_kind("task"))[0]
        assert (final.task_id, final.state, final.exit_code) == ("task-stubborn", S.TASK_STATE_FAILED, 137)
        kinds = [m.WhichOneof("body") for m in stream.received]
        assert kinds[: kinds.index("hello")] == ["heartbeat"] * kinds.index("hello"), kinds
    finally:
        stubborn.kill()
        stubborn.wait()

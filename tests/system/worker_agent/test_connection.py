"""The agent against a fake coordinator on a real gRPC server: registration, tasks, logs, reconnects."""

from __future__ import annotations

import io
import socket
import sys
import tarfile
import textwrap

import grpc

import mwms
from mwms.v1 import agent_pb2
from mwms_testkit.agent_builders import connected, start_task
from mwms_testkit.cluster import pack

S = agent_pb2


def start_task_message(task_id: str, digest: str, **fields: object) -> agent_pb2.CoordinatorMessage:
    return agent_pb2.CoordinatorMessage(start=start_task(task_id, digest, **fields))


TRAIN_AND_SUCCEED = textwrap.dedent(
    """
    import json, os, sys, time
    print("hello from", os.environ["MWMS_TASK_ID"])
    print("a warning", file=sys.stderr)
    with open(os.environ["MWMS_METRICS_FILE"], "a") as metrics:
        metrics.write(json.dumps({"name": "loss", "step": 1, "value": 0.5, "time": time.time()}) + "\\n")
    with open(os.path.join(os.environ["MWMS_OUTPUT_DIR"], "model.txt"), "w") as model:
        model.write("weights")
    print("done")
    """
)

# Prints, then waits for a file named "go" next to the bundle dir, so a test decides when it ends.
WAIT_FOR_GO = textwrap.dedent(
    """
    import os, sys, time
    print("before 1")
    print("before 2")
    go = os.path.join(os.environ["MWMS_OUTPUT_DIR"], "..", "go")
    deadline = time.time() + 30
    while not os.path.exists(go) and time.time() < deadline:
        time.sleep(0.02)
    print("after")
    """
)

IGNORE_SIGTERM = textwrap.dedent(
    """
    import signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ready", flush=True)
    time.sleep(60)
    """
)


def test_register_hello_and_a_task_that_succeeds(coordinator, start_agent, wait_for) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    agent = start_agent(address, join_token="s3cret")
    stream = connected(fake, wait_for)

    request, _ = fake.registrations[0]
    assert (request.name, request.version, request.join_token) == ("test-agent", mwms.__version__, "s3cret")
    assert (request.port_range_low, request.port_range_high) == (20000, 20999)
    assert request.advertise_address == "127.0.0.1"  # the address that reaches a loopback coordinator
    assert [(d.kind, d.index, d.name) for d in request.devices] == [
        (S.DEVICE_KIND_CPU_SLOT, 0, "cpu-slot-0"),
        (S.DEVICE_KIND_CPU_SLOT, 1, "cpu-slot-1"),
    ]
    assert stream.agent_id == "agent-1"
    assert stream.of_kind("hello")[0] == agent_pb2.Hello(agent_id="agent-1")
    wait_for(lambda: stream.of_kind("heartbeat"), "a heartbeat")

    digest = fake.add_bundle(pack({"train.py": TRAIN_AND_SUCCEED}))
    stream.send(start=start_task_message("task-ok", digest).start)
    wait_for(
        lambda: S.TASK_STATE_SUCCEEDED in fake.states("task-ok"),
        "SUCCEEDED",
        observed=lambda: fake.reports("task-ok"),
    )

    reports = fake.reports("task-ok")
    assert [r.state for r in reports] == [S.TASK_STATE_STARTING, S.TASK_STATE_RUNNING, S.TASK_STATE_SUCCEEDED]
    assert reports[1].pid > 0 and reports[2].exit_code == 0
    lines = fake.log_lines("task-ok")
    assert [line.seq for line in lines] == [1, 2, 3]
    assert sorted((line.stream, line.text) for line in lines) == [
        ("stderr", "a warning"),
        ("stdout", "done"),
        ("stdout", "hello from task-ok"),
    ]
    points = [p for batch in stream.of_kind("metrics") for p in batch.points]
    assert [(p.seq, p.name, p.step, p.value) for p in points] == [(1, "loss", 1, 0.5)]

    # The chief's output went up before its final report.
    task_id, kind, data = fake.uploads[0]
    assert (task_id, kind) == ("task-ok", S.FILE_KIND_ARTIFACTS)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert tar.getnames() == ["model.txt"]
    assert fake.timeline.index(("upload", "task-ok", S.FILE_KIND_ARTIFACTS)) < fake.timeline.index(
        ("report", "task-ok", S.TASK_STATE_SUCCEEDED)
    )

    # Everything was acknowledged, so after a reconnect the agent neither lists the task nor resends lines.
    wait_for(lambda: len(stream.of_kind("heartbeat")) >= 3, "the acks to be processed")
    stream.close()
    second = connected(fake, wait_for, count=2)
    wait_for(lambda: len(second.of_kind("heartbeat")) >= 2, "a settled second session")
    assert second.of_kind("hello")[0].tasks == []
    assert second.of_kind("logs") == [] and second.of_kind("metrics") == []
    # A forgotten task leaves nothing on this machine (its artifacts went up before its final report).
    assert not (agent.config.work_dir / "jobs/job-1").exists()
    assert not (agent.config.work_dir / "scratch/task-ok").exists()
    assert agent.shut_down() == 0


def test_tasks_survive_a_broken_stream_and_unacked_lines_are_resent(
    coordinator, start_agent, wait_for, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    fake.auto_ack = False
    agent = start_agent(address)
    first = connected(fake, wait_for)
    digest = fake.add_bundle(pack({"train.py": WAIT_FOR_GO}))
    first.send(start=start_task_message("task-long", digest).start)
    wait_for(
        lambda: len(fake.log_lines("task-long", first)) == 2, "two lines", observed=lambda: first.received
    )
    running = [r for r in fake.reports("task-long") if r.state == S.TASK_STATE_RUNNING][0]
    # The first line is acknowledged, the second is not.
    first.send(ack=agent_pb2.Ack(task_id="task-long", log_seq=1))
    wait_for(lambda: len(first.of_kind("heartbeat")) >= 3, "the ack to be processed")

    first.close()
    second = connected(fake, wait_for, count=2)
    assert len(fake.registrations) == 2
    hello = second.of_kind("hello")[0]
    assert [(t.task_id, t.state, t.pid) for t in hello.tasks] == [
        ("task-long", S.TASK_STATE_RUNNING, running.pid)
    ]
    wait_for(lambda: fake.log_lines("task-long", second), "the unacked line to be resent")
    assert [(line.seq, line.text) for line in fake.log_lines("task-long", second)] == [(2, "before 2")]

    fake.auto_ack = True
    (tmp_path / "agent/jobs/job-1/attempt-1/task-0/go").touch()
    wait_for(
        lambda: S.TASK_STATE_SUCCEEDED in fake.states("task-long"),
        "SUCCEEDED",
        observed=lambda: fake.reports("task-long"),
    )
    assert [(line.seq, line.text) for line in fake.log_lines("task-long", second)][-1] == (3, "after")
    # One process all along: RUNNING was never reported again with another pid.
    assert {r.pid for r in fake.reports("task-long") if r.state == S.TASK_STATE_RUNNING} == {running.pid}
    assert agent.shut_down() == 0


def test_a_coordinator_restart_is_harmless_to_a_running_task(
    serve_coordinator, start_agent, wait_for, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    old, address = serve_coordinator()
    old.auto_ack = False
    agent = start_agent(address)
    stream = connected(old, wait_for)
    digest = old.add_bundle(pack({"train.py": WAIT_FOR_GO}))
    stream.send(start=start_task_message("task-long", digest).start)
    wait_for(lambda: len(old.log_lines("task-long")) == 2, "two lines", observed=lambda: stream.received)
    pid = old.reports("task-long")[-1].pid

    old.server.stop(grace=None)
    new, _ = serve_coordinator(int(address.rsplit(":", 1)[1]))
    fresh = connected(new, wait_for)
    assert [(t.task_id, t.state, t.pid) for t in fresh.of_kind("hello")[0].tasks] == [
        ("task-long", S.TASK_STATE_RUNNING, pid)
    ]
    wait_for(lambda: len(new.log_lines("task-long")) == 2, "the unacked lines resent to the new coordinator")
    (tmp_path / "agent/jobs/job-1/attempt-1/task-0/go").touch()
    wait_for(
        lambda: S.TASK_STATE_SUCCEEDED in new.states("task-long"),
        "SUCCEEDED",
        observed=lambda: new.reports("task-long"),
    )
    assert [line.text for line in new.log_lines("task-long")] == ["before 1", "before 2", "after"]
    assert agent.shut_down() == 0


def test_rejections_port_in_use_bad_digest_and_unknown_format(coordinator, start_agent, wait_for) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    start_agent(address)
    stream = connected(fake, wait_for)
    good = fake.add_bundle(pack({"train.py": "print('hi')"}))
    with socket.socket() as listener:
        listener.bind(("", 0))
        listener.listen()
        busy_port = listener.getsockname()[1]
        stream.send(start=start_task_message("task-port", good, port=busy_port).start)
        wait_for(
            lambda: S.TASK_STATE_REJECTED in fake.states("task-port"),
            "REJECTED",
            observed=lambda: fake.reports("task-port"),
        )

    wrong = "0" * 64
    fake.bundles[wrong] = pack({"train.py": "print('tampered')"})
    stream.send(start=start_task_message("task-digest", wrong).start)
    not_an_archive = fake.add_bundle(b"just some text")
    stream.send(start=start_task_message("task-format", not_an_archive).start)
    for task_id in ("task-digest", "task-format"):
        wait_for(
            lambda t=task_id: S.TASK_STATE_REJECTED in fake.states(t),
            f"{task_id} REJECTED",
            observed=lambda: stream.received,
        )

    def final_message(task_id: str) -> str:
        return fake.reports(task_id)[-1].message

    assert f"port {busy_port} is already in use on host" in final_message("task-port")
    assert "the coordinator will place the job again" in final_message("task-port")
    assert "bundle digest mismatch" in final_message("task-digest")
    assert "neither a tar.gz nor a zip" in final_message("task-format")
    assert fake.states("task-port") == [S.TASK_STATE_STARTING, S.TASK_STATE_REJECTED]


def test_a_bundle_is_fetched_once_and_a_stop_cancels_a_start(coordinator, start_agent, wait_for) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    start_agent(address)
    stream = connected(fake, wait_for)
    digest = fake.add_bundle(pack({"train.py": "print('hi')"}))
    for task_id in ("task-a", "task-b"):
        stream.send(start=start_task_message(task_id, digest, task_index=1).start)
        wait_for(lambda t=task_id: S.TASK_STATE_SUCCEEDED in fake.states(t), f"{task_id} SUCCEEDED")
    assert fake.bundle_fetches == [digest]

    fake.bundles_released.clear()
    held = fake.add_bundle(pack({"train.py": "print('never')"}))
    stream.send(start=start_task_message("task-held", held, task_index=1).start)
    wait_for(lambda: held in fake.bundle_fetches, "the fetch to begin")
    stream.send(stop=agent_pb2.StopTask(task_id="task-held", reason="job cancelled"))
    wait_for(lambda: S.TASK_STATE_STOPPED in fake.states("task-held"), "STOPPED while STARTING")
    fake.bundles_released.set()
    wait_for(lambda: len(stream.of_kind("heartbeat")) >= 3, "the start thread to finish")
    assert [(r.state, r.message) for r in fake.reports("task-held")] == [
        (S.TASK_STATE_STARTING, ""),
        (S.TASK_STATE_STOPPED, "job cancelled"),
    ]
    assert fake.log_lines("task-held") == []


def test_stop_kills_a_task_that_ignores_sigterm_and_unknown_stops_are_answered(
    coordinator, start_agent, wait_for
) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    start_agent(address)
    stream = connected(fake, wait_for)
    digest = fake.add_bundle(pack({"train.py": IGNORE_SIGTERM}))
    start = start_task_message("task-stubborn", digest, task_index=1)
    stream.send(start=start.start)
    wait_for(lambda: any(line.text == "ready" for line in fake.log_lines("task-stubborn")), "ready")
    # A second start for the same task only repeats its report.
    stream.send(start=start.start)
    wait_for(lambda: fake.states("task-stubborn").count(S.TASK_STATE_RUNNING) == 2, "the repeated report")

    stream.send(
        stop=agent_pb2.StopTask(task_id="task-stubborn", reason="cancelled by alice", grace_seconds=1)
    )
    stream.send(stop=agent_pb2.StopTask(task_id="task-nobody-knows", reason="cleanup"))
    wait_for(
        lambda: S.TASK_STATE_STOPPED in fake.states("task-stubborn"),
        "STOPPED",
        observed=lambda: fake.reports("task-stubborn"),
    )
    final = fake.reports("task-stubborn")[-1]
    assert (final.state, final.exit_code, final.message) == (S.TASK_STATE_STOPPED, 137, "cancelled by alice")
    unknown = fake.reports("task-nobody-knows")
    assert [(r.state, r.message) for r in unknown] == [(S.TASK_STATE_STOPPED, "not running on this agent")]
    assert fake.uploads == []  # not the chief


def test_stopping_the_agent_stops_its_tasks_and_reports_them(coordinator, start_agent, wait_for) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    agent = start_agent(address, stop_grace=0.5)
    stream = connected(fake, wait_for)
    digest = fake.add_bundle(pack({"train.py": IGNORE_SIGTERM}))
    stream.send(start=start_task_message("task-1", digest).start)
    wait_for(lambda: any(line.text == "ready" for line in fake.log_lines("task-1")), "ready")
    pid = fake.reports("task-1")[-1].pid
    assert agent.shut_down() == 0
    final = fake.reports("task-1")[-1]
    assert (final.state, final.exit_code) == (S.TASK_STATE_STOPPED, 137)
    assert not _alive(pid)
    # A clean stop: the last message, after the final report, is a Goodbye (the coordinator holds the agent
    # as stopped, not lost), and then the agent half-closed the stream.
    kinds = [m.WhichOneof("body") for m in stream.received]
    assert kinds.count("goodbye") == 1 and kinds[-1] == "goodbye", kinds[-5:]
    assert "told to stop" in stream.of_kind("goodbye")[0].reason
    assert stream.reader_done.is_set()


def test_a_refused_join_token_ends_the_agent_with_code_2(coordinator, start_agent, wait_for) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    fake.refuse_with = grpc.StatusCode.UNAUTHENTICATED
    agent = start_agent(address, join_token="wrong")
    agent.thread.join(10)
    assert agent.exit_code == 2
    assert fake.streams == []


def test_the_agent_waits_for_a_coordinator_that_is_not_up_yet(
    serve_coordinator, start_agent, wait_for
) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    agent = start_agent(f"127.0.0.1:{port}")
    agent.thread.join(0.5)  # refused connections must not end it
    assert agent.thread.is_alive()
    fake, _ = serve_coordinator(port)
    connected(fake, wait_for)
    assert agent.shut_down() == 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


assert sys.platform.startswith("linux"), "these tests use process groups and /proc"


def test_a_task_that_ended_unacknowledged_is_finalised_after_its_last_lines(
    coordinator, start_agent, wait_for
) -> None:  # type: ignore[no-untyped-def]
    fake, address = coordinator
    fake.auto_ack = False  # nothing acknowledged: the task's lines and final report stay pending
    agent = start_agent(address)
    first = connected(fake, wait_for)
    program = "import sys\nprint('the cause: bad input', flush=True)\nsys.exit(3)\n"
    digest = fake.add_bundle(pack({"train.py": program}))
    first.send(start=start_task_message("task-fails", digest).start)
    wait_for(lambda: S.TASK_STATE_FAILED in fake.states("task-fails"), "FAILED on the first stream")

    first.close()
    second = connected(fake, wait_for, count=2)
    hello = second.of_kind("hello")[0]
    assert [(t.task_id, t.state) for t in hello.tasks] == [("task-fails", S.TASK_STATE_RUNNING)]

    def final_after_lines() -> bool:
        kinds = [
            (m.WhichOneof("body"), m.task.state if m.WhichOneof("body") == "task" else None)
            for m in list(second.received)
        ]
        return ("task", S.TASK_STATE_FAILED) in kinds and ("logs", None) in kinds

    wait_for(
        final_after_lines,
        "the lines and the final report on the new stream",
        observed=lambda: second.received,
    )
    order = [m.WhichOneof("body") for m in second.received if m.WhichOneof("body") in ("logs", "task")]
    assert order.index("logs") < order.index("task"), order
    assert "the cause: bad input" in [line.text for line in fake.log_lines("task-fails", second)]
    assert agent.shut_down() == 0

"""A task's child process: output lines, exit codes, SIGTERM then SIGKILL, and its environment."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

from mwms.v1 import agent_pb2
from mwms.worker_agent.runner import TaskProcess, describe_exit
from mwms.worker_agent.task_env import TaskPaths, child_environment, resolve_command


class Recorder:
    """Collects what a TaskProcess reports through its callbacks."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []
        self.exit_code: int | None = None
        self.exited = threading.Event()
        self._lock = threading.Lock()

    def on_output(self, stream: str, text: str, redraw: bool = False) -> None:
        with self._lock:
            self.lines.append((stream, text))

    def on_exit(self, exit_code: int) -> None:
        self.exit_code = exit_code
        self.exited.set()


def run_python(code: str, tmp_path: Path, env: dict[str, str] | None = None) -> tuple[TaskProcess, Recorder]:
    recorder = Recorder()
    process = TaskProcess(
        resolve_command(["python", "-c", code]), env or {}, tmp_path, recorder.on_output, recorder.on_exit
    )
    process.start()
    return process, recorder


def test_stdout_and_stderr_lines_arrive_and_exit_code_is_reported(tmp_path: Path) -> None:
    code = "import sys\nprint('one')\nprint('two', file=sys.stderr)\nprint('caf\\u00e9')\nsys.exit(3)"
    _, recorder = run_python(code, tmp_path)
    assert recorder.exited.wait(10), recorder.lines
    assert recorder.exit_code == 3
    assert sorted(recorder.lines) == [("stderr", "two"), ("stdout", "café"), ("stdout", "one")]


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path, wait_for) -> None:
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    process, recorder = run_python(code, tmp_path)
    wait_for(
        lambda: ("stdout", "ready") in recorder.lines,
        "the child to install its handler",
        observed=lambda: recorder.lines,
    )
    process.terminate(grace_seconds=0.3)
    assert recorder.exited.wait(10)
    assert recorder.exit_code == 137
    assert describe_exit(137) == "exited with code 137 (SIGKILL)"


def test_python_means_the_agents_own_interpreter(tmp_path: Path) -> None:
    assert resolve_command(["python3", "train.py"]) == [sys.executable, "train.py"]
    assert resolve_command(["./run.sh"]) == ["./run.sh"]
    _, recorder = run_python("import sys; print(sys.executable)", tmp_path)
    assert recorder.exited.wait(10)
    assert recorder.lines == [("stdout", sys.executable)]


def start_task(**fields: object) -> agent_pb2.StartTask:
    defaults: dict[str, object] = dict(
        task_id="t-1", job_id="j-1", attempt=2, task_index=1, num_workers=2, command=["python", "train.py"]
    )
    defaults.update(fields)
    return agent_pb2.StartTask(**defaults)  # type: ignore[arg-type]


def test_child_environment_for_a_gpu_worker_of_a_multi_worker_job(tmp_path: Path) -> None:
    tf_config = json.dumps({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}})
    start = start_task(
        tf_config=tf_config,
        device_kind=agent_pb2.DEVICE_KIND_GPU,
        device_indices=[2, 3],
        env={"MWMS_COMMUNICATION": "nccl", "MWMS_JOB_ID": "not-this"},
    )
    paths = TaskPaths.for_task(tmp_path, start)
    paths.create_fresh()
    env = child_environment(
        start, paths, {"PATH": "/usr/bin", "TF_CONFIG": "stale", "CUDA_VISIBLE_DEVICES": "0"}
    )
    # The child really sees it.
    process = TaskProcess(
        resolve_command(["python", "-c", "import json, os; print(json.dumps(dict(os.environ)))"]),
        env,
        paths.bundle_dir,
        (recorder := Recorder()).on_output,
        recorder.on_exit,
    )
    process.start()
    assert recorder.exited.wait(10) and recorder.exit_code == 0, recorder.lines
    seen = json.loads(recorder.lines[0][1])
    assert seen["TF_CONFIG"] == tf_config
    assert seen["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert seen["MWMS_DEVICE_KIND"] == "gpu" and seen["MWMS_NUM_GPUS"] == "2"
    assert seen["MWMS_COMMUNICATION"] == "nccl"
    assert seen["MWMS_JOB_ID"] == "j-1"
    assert (
        seen["MWMS_TASK_ID"],
        seen["MWMS_ATTEMPT"],
        seen["MWMS_TASK_INDEX"],
        seen["MWMS_NUM_WORKERS"],
    ) == (
        "t-1",
        "2",
        "1",
        "2",
    )
    assert seen["MWMS_OUTPUT_DIR"] == str(tmp_path / "jobs/j-1/attempt-2/task-1/output")
    assert seen["MWMS_CHECKPOINT_DIR"] == str(tmp_path / "jobs/j-1/attempt-2/task-1/checkpoints")
    assert seen["MWMS_METRICS_FILE"] == str(tmp_path / "jobs/j-1/attempt-2/task-1/metrics.jsonl")
    assert seen["TF_USE_LEGACY_KERAS"] == "1" and seen["PYTHONUNBUFFERED"] == "1"
    assert seen["PATH"] == "/usr/bin"


def test_child_environment_for_a_single_cpu_worker_drops_an_inherited_tf_config(tmp_path: Path) -> None:
    start = start_task(
        num_workers=1,
        task_index=0,
        device_kind=agent_pb2.DEVICE_KIND_CPU_SLOT,
        device_indices=[0],
        env={"TF_USE_LEGACY_KERAS": "0"},
        shared_checkpoint_dir=str(tmp_path / "shared"),
    )
    paths = TaskPaths.for_task(tmp_path, start)
    env = child_environment(start, paths, {"TF_CONFIG": "from the agent's shell"})
    assert "TF_CONFIG" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["MWMS_DEVICE_KIND"] == "cpu" and env["MWMS_NUM_GPUS"] == "0"
    assert env["TF_USE_LEGACY_KERAS"] == "0"
    assert env["MWMS_CHECKPOINT_DIR"] == str(tmp_path / "shared")


def test_a_task_gets_none_of_the_agents_secrets(tmp_path: Path) -> None:
    start = start_task(env={"MY_SETTING": "kept"})
    paths = TaskPaths.for_task(tmp_path, start)
    agent_env = {"PATH": "/usr/bin", "MWMS_JOIN_TOKEN": "j", "MWMS_TOKEN": "t", "MWMS_ADMIN_TOKEN": "a"}
    env = child_environment(start, paths, agent_env)
    assert not {"MWMS_JOIN_TOKEN", "MWMS_TOKEN", "MWMS_ADMIN_TOKEN"} & set(env)
    assert env["MY_SETTING"] == "kept" and env["PATH"] == "/usr/bin"

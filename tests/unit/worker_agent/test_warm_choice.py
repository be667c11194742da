"""Which tasks may start in a warm interpreter (worker_agent/warm_choice.py): the pure decision."""

from __future__ import annotations

import sys

import pytest

from mwms.worker_agent.warm_choice import (
    NO_POOL_FOR_GPUS,
    NO_WARM_INTERPRETER,
    StartShape,
    changed_variables,
    cold_reason,
    import_relevant,
    runs_python_file,
)

PYTHON = sys.executable
POOL_ENV = {
    "PATH": "/usr/bin",
    "TF_USE_LEGACY_KERAS": "1",
    "PYTHONPATH": "/hooks",
    "PYTHONUNBUFFERED": "1",
    "CUDA_VISIBLE_DEVICES": "",
    "MWMS_TASK_ID": "warm-1",
    "HOME": "/work/warm/warm-1/task/home",
}


def shape(**changes: object) -> StartShape:
    base: dict[str, object] = {
        "command": [PYTHON, "train.py", "--epochs", "1"],
        "env": {**POOL_ENV, "MWMS_TASK_ID": "abc123", "HOME": "/elsewhere", "MY_SETTING": "x"},
        "own_environment": False,
        "preflight": False,
        "shared_checkpoints": False,
        "co_located_peer": False,
    }
    base.update(changes)
    return StartShape(**base)  # type: ignore[arg-type]


def test_a_plain_python_file_with_the_pools_import_variables_starts_warm():
    assert cold_reason(shape(), PYTHON, POOL_ENV, kept=True, ready=True) == ""


def test_without_a_ready_interpreter_it_starts_cold():
    assert cold_reason(shape(), PYTHON, POOL_ENV, kept=True, ready=False) == NO_WARM_INTERPRETER
    assert cold_reason(shape(), PYTHON, None, kept=True, ready=False) == NO_WARM_INTERPRETER
    assert cold_reason(shape(), PYTHON, None, kept=False, ready=False) == NO_POOL_FOR_GPUS


def test_a_variable_that_differs_is_named_even_while_no_interpreter_is_ready():
    reason = cold_reason(
        shape(env={**POOL_ENV, "OMP_NUM_THREADS": "1"}), PYTHON, POOL_ENV, kept=True, ready=False
    )
    assert "OMP_NUM_THREADS" in reason


@pytest.mark.parametrize(
    "name, value",
    [
        ("TF_CPP_MIN_LOG_LEVEL", "2"),
        ("TF_USE_LEGACY_KERAS", "0"),
        ("PYTHONPATH", "/job/lib"),
        ("PYTHONHASHSEED", "0"),
        ("LD_PRELOAD", "/lib/libjemalloc.so"),
        ("XLA_FLAGS", "--xla_gpu_autotune_level=0"),
        ("CUDA_MODULE_LOADING", "EAGER"),
        ("OMP_NUM_THREADS", "1"),
        ("KMP_AFFINITY", "granularity=fine"),
        ("MALLOC_ARENA_MAX", "2"),
        ("MWMS_AUTO_METRICS", "0"),
    ],
)
def test_a_variable_read_at_import_that_differs_starts_cold_and_is_named(name, value):
    changed = shape(env={**POOL_ENV, name: value})
    reason = cold_reason(changed, PYTHON, POOL_ENV, kept=True, ready=True)
    assert name in reason and "TensorFlow is imported" in reason


def test_a_removed_import_variable_counts_as_a_change():
    env = {k: v for k, v in POOL_ENV.items() if k != "TF_USE_LEGACY_KERAS"}
    assert changed_variables(env, POOL_ENV) == ["TF_USE_LEGACY_KERAS"]


def test_the_per_task_gpu_and_cluster_variables_and_other_names_do_not_count():
    env = {**POOL_ENV, "CUDA_VISIBLE_DEVICES": "GPU-1234", "TF_CONFIG": "{}", "MWMS_JOB_ID": "j", "X": "y"}
    assert changed_variables(env, POOL_ENV) == []
    assert not import_relevant("CUDA_VISIBLE_DEVICES") and not import_relevant("TF_CONFIG")
    assert import_relevant("CUDA_CACHE_PATH") and not import_relevant("HOME")


def test_many_changed_variables_are_named_up_to_five():
    env = {**POOL_ENV, **{f"TF_X{i}": "1" for i in range(8)}}
    assert "and 3 more" in cold_reason(shape(env=env), PYTHON, POOL_ENV, kept=True, ready=True)


@pytest.mark.parametrize(
    "command",
    [
        [PYTHON, "-m", "trainer"],
        [PYTHON, "-u", "train.py"],
        [PYTHON],
        ["/bin/sh", "run.sh"],
        ["/usr/bin/python2", "train.py"],
        [PYTHON, "train"],
    ],
)
def test_anything_but_the_agents_python_running_a_py_file_starts_cold(command):
    assert not runs_python_file(command, PYTHON)
    assert "not `python <file>.py`" in cold_reason(
        shape(command=command), PYTHON, POOL_ENV, kept=True, ready=True
    )


@pytest.mark.parametrize(
    "change, words",
    [
        ({"own_environment": True}, "own Python environment"),
        ({"preflight": True}, "preflight"),
        ({"shared_checkpoints": True}, "shared filesystem"),
        ({"co_located_peer": True}, "shares this machine"),
    ],
)
def test_what_is_fixed_when_the_sandbox_starts_makes_a_cold_start(change, words):
    assert words in cold_reason(shape(**change), PYTHON, POOL_ENV, kept=True, ready=True)


def test_a_memory_limit_below_what_the_warm_interpreter_holds_starts_cold():
    held = 600 * 1024**2
    small = shape(memory_limit_bytes=512 * 1024**2)
    assert "memory limit" in cold_reason(
        small, PYTHON, POOL_ENV, kept=True, ready=True, warm_memory_bytes=held
    )
    roomy = shape(memory_limit_bytes=8 * 1024**3)
    assert cold_reason(roomy, PYTHON, POOL_ENV, kept=True, ready=True, warm_memory_bytes=held) == ""
    assert cold_reason(shape(), PYTHON, POOL_ENV, kept=True, ready=True, warm_memory_bytes=held) == ""

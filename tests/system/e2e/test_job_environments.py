"""A job brings its own Python environment: resolved once at submit with uv, built once per agent, cached.

Real uv against the real package registry, the shared cluster's two agents (sandboxed when the tests run
as root, as in CI). `tabulate` is not in the agents' environment (checked), so a job that imports it
works only in its own.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mwms.cli.main import app
from mwms.client import Client
from mwms.errors import InvalidSpec

pytestmark = pytest.mark.e2e

PROGRAM = """
import importlib.util
import sys
import tabulate
import mwms_runtime  # the runtime is importable in a job's own environment (with numpy, as TF brings)
# By default the environment extends the agents' runtime: their TensorFlow is there (not imported: slow).
base = "tf" if importlib.util.find_spec("tensorflow") and importlib.util.find_spec("tf_keras") else "no-tf"
assert mwms_runtime.context().num_workers == 2
try:
    import mwms.client  # mwms's own packages are not
    leaked = "LEAKED"
except ImportError:
    leaked = "sealed"
print(f"ENV tabulate {tabulate.__version__} {leaked} {base} prefix={sys.prefix}", flush=True)
"""


def _registry_reachable() -> bool:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        return False
    probe = subprocess.run(
        [uv, "pip", "compile", "-", "--universal", "--quiet"],
        input="tabulate==0.9.0\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    return probe.returncode == 0


@pytest.fixture(scope="module")
def client(cluster):
    if importlib.util.find_spec("tabulate") is not None:
        pytest.fail("tabulate is in the agents' environment: pick a package the test can be sure is missing")
    if not _registry_reachable():
        pytest.skip("uv cannot reach the package registry")
    with Client(cluster.api, token=cluster.admin_token) as instance:
        yield instance


def _program(tmp_path: Path, requirements: str) -> Path:
    directory = tmp_path / "program"
    directory.mkdir()
    (directory / "train.py").write_text(PROGRAM)
    (directory / "requirements.txt").write_text(requirements)
    return directory


def test_a_job_runs_in_its_own_environment_built_once_per_agent(cluster, client, tmp_path):
    directory = _program(tmp_path, "tabulate==0.9.0\nnumpy>=2,<3\n")
    first = client.submit(directory, "python train.py", workers=2, requirements="requirements.txt")
    job = cluster.wait_for(first.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=240)
    logs = cluster.logs_text(first.id)
    assert job["state"] == "SUCCEEDED", job["reason"] + logs
    environment = job["environment"]
    assert environment["requirements"] == "requirements.txt" and environment["python"] is None
    assert {p.split("==")[0] for p in environment["packages"]} == {"numpy", "tabulate"}, environment
    assert "tabulate==0.9.0" in environment["packages"]
    for index in (0, 1):
        assert f"[{index}] ENV tabulate 0.9.0 sealed tf" in logs, logs
    assert "building environment" in logs, logs
    assert all(task["environment"] == "ready" for task in job["tasks"]), job["tasks"]
    # The agents share the machine's cache (--env-cache-dir): one built it while the other waited for
    # that build, then took it from the cache; both run in the same environment.
    assert logs.count("from the cache (no install)") == 1 and logs.count(" built in ") == 1, logs
    assert sorted(bool(task["environment_build_seconds"]) for task in job["tasks"]) == [False, True]
    prefixes = {line.split("prefix=")[1] for line in logs.splitlines() if "ENV tabulate" in line}
    assert len(prefixes) == 1, prefixes

    # The same requirements again: nothing is installed.
    second = client.submit(directory, "python train.py", workers=2, requirements="requirements.txt")
    job = cluster.wait_for(second.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    logs = cluster.logs_text(second.id)
    assert job["state"] == "SUCCEEDED", job["reason"] + logs
    assert [task["environment_build_seconds"] for task in job["tasks"]] == [0, 0], job["tasks"]
    assert logs.count("from the cache (no install)") == 2, logs


def test_a_requirement_that_does_not_resolve_is_refused_at_submit_naming_it(cluster, client, tmp_path):
    directory = _program(tmp_path, "tabulatezzzq\n")
    jobs_before = len(client.jobs(limit=500))
    with pytest.raises(InvalidSpec, match="tabulatezzzq"):
        client.submit(directory, "python train.py", workers=2, requirements="requirements.txt")
    assert len(client.jobs(limit=500)) == jobs_before  # nothing was created


def test_a_lock_that_cannot_be_installed_fails_the_job_at_once_with_uvs_reason(cluster, client, tmp_path):
    # A lock made elsewhere, pinning a version the index does not have: the agents' build fails, and
    # no restart can help.
    directory = _program(tmp_path, "")
    job_id = cluster.submit(
        {"train.py": PROGRAM},
        ["python", "train.py"],
        workers=2,
        restart={"max_restarts": 3},
        environment={"requirements": "requirements.txt", "locked": "tabulate==0.0.999\n"},
    )
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
    assert job["state"] == "FAILED", job
    assert "tabulate" in job["reason"] and "not retried" in job["reason"], job["reason"]
    assert "Python environment cannot be built" in job["reason"], job["reason"]
    assert job["restarts"] == 0
    assert directory.exists()


def test_the_cli_submits_with_requirements_and_status_lists_the_packages(cluster, client, tmp_path):
    directory = _program(tmp_path, "tabulate==0.9.0\nnumpy>=2,<3\n")
    submitted = CliRunner().invoke(
        app,
        ["submit", str(directory), "--workers", "2", "--requirements", "requirements.txt"]
        + ["--api", cluster.api, "--token", cluster.admin_token, "--wait", "--", "python", "train.py"],
    )
    assert submitted.exit_code == 0, submitted.output
    assert (
        "resolved 2 packages, to install over the agents' runtime (TensorFlow, tf-keras, numpy); each agent "
        "builds them once and caches them" in " ".join(submitted.stderr.split())
    ), submitted.stderr
    job_id = submitted.stdout.splitlines()[0].strip()
    shown = CliRunner().invoke(app, ["status", job_id, "--api", cluster.api, "--token", cluster.admin_token])
    assert shown.exit_code == 0, shown.output
    assert (
        "python env:   requirements.txt (Python the agents' version, 2 packages, over the agents' runtime)"
        in shown.stdout
    ), shown.stdout
    assert "tabulate==0.9.0" in shown.stdout and "worker 0 ready (cached)" in shown.stdout, shown.stdout


def test_an_isolated_environment_lacks_tensorflow_and_the_failure_names_the_module(cluster, client, tmp_path):
    directory = _program(tmp_path, "tabulate==0.9.0\n")
    (directory / "train.py").write_text("import tabulate\nimport tensorflow\n")
    submitted = CliRunner().invoke(
        app,
        ["submit", str(directory), "--workers", "2", "--requirements", "requirements.txt", "--isolated-env"]
        + ["--max-restarts", "0", "--api", cluster.api, "--token", cluster.admin_token]
        + ["--", "python", "train.py"],
    )
    assert submitted.exit_code == 0, submitted.output
    assert "to install alone (isolated)" in submitted.stderr, submitted.stderr
    job_id = submitted.stdout.splitlines()[0].strip()
    job = cluster.wait_for(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=240)
    assert job["state"] == "FAILED" and job["environment"]["isolated"] is True, job
    reason = " ".join(job["reason"].split())
    assert "the program could not import 'tensorflow'" in reason, reason
    assert "the job's environment is isolated" in reason and "without --isolated-env" in reason, reason
    lone = CliRunner().invoke(
        app,
        ["submit", str(directory), "--workers", "1", "--isolated-env", "--api", cluster.api]
        + ["--token", cluster.admin_token, "--", "python", "train.py"],
    )
    assert lone.exit_code != 0 and "--isolated-env is about the job's own environment" in lone.output


def test_a_program_with_requirements_but_no_flag_hears_how_to_use_them(cluster, tmp_path):
    directory = _program(tmp_path, "tabulate==0.9.0\n")
    (directory / "train.py").write_text("print('agents own')\n")
    submitted = CliRunner().invoke(
        app,
        ["submit", str(directory), "--workers", "1", "--api", cluster.api, "--token", cluster.admin_token]
        + ["--", "python", "train.py"],
    )
    assert submitted.exit_code == 0, submitted.output
    assert (
        f"requirements.txt in {directory} is not used: the job runs in the agents' environment; to give it its "
        "own, submit with --requirements requirements.txt" in " ".join(submitted.stderr.split())
    ), submitted.stderr
    lone_python = CliRunner().invoke(
        app,
        ["submit", str(directory), "--workers", "1", "--python", "3.11", "--api", cluster.api]
        + ["--token", cluster.admin_token, "--", "python", "train.py"],
    )
    assert lone_python.exit_code != 0
    assert (
        "--python is the version of the job's own environment: give --requirements too" in lone_python.output
    )


TF_PROGRAM = """
import os, sys
import numpy as np
import tensorflow as tf
import mwms_runtime

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
data = tf.data.Dataset.from_tensor_slices((np.ones((16, 4), "float32"), np.ones((16, 1), "float32"))).batch(8)
history = model.fit(data, epochs=1, verbose=0)
print(f"TFENV tensorflow {tf.__version__} in {sys.prefix} loss {history.history['loss'][-1]:.3f}", flush=True)
"""


@pytest.mark.tf
def test_a_tensorflow_job_runs_with_its_own_pinned_tensorflow(cluster, client, tmp_path):
    directory = tmp_path / "tf-program"
    directory.mkdir()
    (directory / "train.py").write_text(TF_PROGRAM)
    (directory / "requirements.txt").write_text("tensorflow-cpu==2.21.0\ntf-keras==2.21.0\n")
    job = client.submit(directory, "python train.py", workers=2, requirements="requirements.txt")
    ended = cluster.wait_for(job.id, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=900)
    logs = cluster.logs_text(job.id)
    assert ended["state"] == "SUCCEEDED", ended["reason"] + logs
    lines = [line for line in logs.splitlines() if "TFENV tensorflow 2.21.0 in " in line]
    assert len(lines) == 2 and all(f"{cluster.root}/envs/envs/" in line for line in lines), logs
    assert "tensorflow-cpu==2.21.0" in ended["environment"]["packages"]

"""Every example under examples/ runs on two workers as examples/README.md says, through the real CLI.

Each bundle directory is submitted with `mwms submit examples/<name> --workers 2 --wait -- python train.py
...` (the `mwms` executable, pointed at the shared cluster by MWMS_API and MWMS_TOKEN), with the documented
flags that keep the run to a few steps; `examples/notebook_submit.py` runs as a client script. A new example
directory fails `test_every_example_directory_is_run` until it is given a run here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from mwms_testkit import REPO
from mwms_testkit.cluster import MWMS

pytestmark = [pytest.mark.e2e, pytest.mark.tf]

EXAMPLES = REPO / "examples"

# name -> the program's flags for a short run, and lines its logs must hold ([task] text, as regexes).
RUNS: dict[str, tuple[list[str], list[str]]] = {
    "keras_fit": (
        ["--epochs", "2", "--steps-per-epoch", "3"],
        [r"\[0\] FINAL loss=\d+\.\d{4} steps=6", r"\[1\] FINAL loss=\d+\.\d{4} steps=6"],
    ),
    "custom_loop": (
        ["--steps", "6", "--checkpoint-every", "3", "--print-every", "3"],
        [r"\[0\] step=6 local_loss=", r"\[0\] FINAL loss=\d+\.\d{4} steps=6 resumed_from=0"],
    ),
    "sharded_files": (
        ["--steps", "6"],
        [
            r"\[0\] policy=FILE files=4 workers=2",
            r"\[0\] SAW worker=0 files=\[0, 2\] ids=",  # FILE sharding: each worker reads its own files
            r"\[1\] SAW worker=1 files=\[1, 3\] ids=",
            r"\[0\] FINAL loss=\d+\.\d{4} steps=6",
        ],
    ),
}


def _client_environment(cluster) -> dict[str, str]:
    """This process's environment, pointed at the shared cluster as `mwms login` would point it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MWMS_") and k != "TF_CONFIG"}
    return dict(env, MWMS_API=cluster.api, MWMS_TOKEN=cluster.admin_token, PYTHONUNBUFFERED="1")


def test_every_example_directory_is_run():
    directories = sorted(p.name for p in EXAMPLES.iterdir() if (p / "train.py").is_file())
    assert directories == sorted(RUNS), "give each example directory a short run in RUNS"


@pytest.mark.parametrize("name", sorted(RUNS))
def test_example_runs_on_two_workers(cluster, name):
    flags, expected = RUNS[name]
    submitted = subprocess.run(
        [MWMS, "submit", str(EXAMPLES / name), "--workers", "2", "--wait", "--", "python", "train.py"]
        + flags,
        env=_client_environment(cluster),
        capture_output=True,
        text=True,
        timeout=240,
    )
    job_id = submitted.stdout.splitlines()[0].strip() if submitted.stdout else ""
    logs = cluster.logs_text(job_id) if job_id else ""
    assert submitted.returncode == 0, f"{submitted.stdout}\n{submitted.stderr}\n{logs}"
    job = cluster.job(job_id)
    assert job["state"] == "SUCCEEDED", f"{job['reason']}\n{logs}"
    for pattern in expected:
        assert re.search(pattern, logs), f"no line matching {pattern!r} in:\n{logs}"


def test_notebook_submit_runs_keras_fit_and_downloads_its_model(cluster, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(cluster.admin_token)
    token_file.chmod(0o600)
    env = _client_environment(cluster)
    del env["MWMS_TOKEN"]  # given as --token-file, as the example's docstring runs it
    ran = subprocess.run(
        [sys.executable, str(EXAMPLES / "notebook_submit.py"), "--api", cluster.api]
        + ["--token-file", str(token_file), "--epochs", "1", "--steps-per-epoch", "3"]
        + ["--output", str(tmp_path / "artifacts")],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert ran.returncode == 0, f"{ran.stdout}\n{ran.stderr}"
    ended = re.search(r"^job (\S+) ended SUCCEEDED$", ran.stdout, re.MULTILINE)
    assert ended, ran.stdout
    # The metrics table has a row for step 3, the run's last.
    assert re.search(r"^\s+3\s+\d+\.\d{4}", ran.stdout, re.MULTILINE), ran.stdout
    assert f"artifacts to {tmp_path / 'artifacts' / ended[1]}:" in ran.stdout, ran.stdout
    assert list((tmp_path / "artifacts" / ended[1]).rglob("model.keras*")), ran.stdout

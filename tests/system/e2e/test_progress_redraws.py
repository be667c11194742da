"""End to end: a program that redraws a progress line with `\\r` (as Keras' fit(verbose=1) and tqdm do), on
the shared cluster's real agents and coordinator: the line moves while it runs (a follow gets its newer states,
marked redraw, about one a second), and the log page, `mwms logs` and the failure reason show each line's
final state only; on a terminal `mwms logs -f` overwrites the line in place."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import time
from datetime import datetime

import pytest

from mwms_testkit.cluster import MWMS, Cluster

pytestmark = pytest.mark.e2e

# Two "epochs" of a bar redrawn every 0.25 s, backspaces before each state as Keras writes them, a warning
# on stderr meanwhile, then a failure.
PROGRESS = r"""
import sys, time
STEPS = 12
for epoch in (1, 2):
    print(f"Epoch {epoch}/2", flush=True)
    width = 0
    for step in range(1, STEPS + 1):
        bar = f"{step}/{STEPS} [" + "=" * step + "." * (STEPS - step) + "]"
        sys.stdout.write("\b" * width + "\r" + bar)
        sys.stdout.flush()
        width = len(bar)
        if step == 3:
            print("a warning", file=sys.stderr, flush=True)
        time.sleep(0.25 if epoch == 1 else 0.0)
    sys.stdout.write("\b" * width + "\r" + f"{STEPS}/{STEPS} - loss: 0.{epoch}\n")
    sys.stdout.flush()
raise SystemExit("boom after two epochs")
"""
FINAL_LINES = ["Epoch 1/2", "12/12 - loss: 0.1", "Epoch 2/2", "12/12 - loss: 0.2"]


def cli_env(cluster: Cluster) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MWMS_")}
    env.update(MWMS_API=cluster.api, MWMS_TOKEN=cluster.admin_token, COLUMNS="120")
    return env


def follow_api(cluster: Cluster, job_id: str, timeout: float = 90) -> list[tuple[float, dict]]:
    """Every line of a follow of task 0 until the job ends, with when it arrived (unix seconds, to compare
    with the lines' own times: the agent is on this machine)."""
    seen: list[tuple[float, dict]] = []
    params = {"follow": "true", "task": "0"}
    with cluster.http.stream("GET", f"/api/v1/jobs/{job_id}/logs", params=params, timeout=timeout) as answer:
        assert answer.status_code == 200
        for text in answer.iter_lines():
            if text.strip():
                seen.append((time.time(), json.loads(text)))
    return seen


def test_a_redrawn_line_moves_live_and_reads_as_its_final_state(cluster: Cluster) -> None:
    job_id = cluster.submit(
        {"progress.py": PROGRESS}, ["python", "progress.py"], workers=1, restart={"max_restarts": 0}
    )
    followed = follow_api(cluster, job_id)
    job = cluster.wait_for(job_id, {"FAILED", "SUCCEEDED", "CANCELLED"}, timeout=60)
    assert job["state"] == "FAILED", job["reason"]

    stdout = [(at, line) for at, line in followed if line["stream"] == "stdout"]
    texts = [line["text"] for _, line in stdout]
    # Epoch 1's bar took 3 s: several of its states came while it ran, each marked as replacing the last.
    first = texts.index("Epoch 1/2")
    epoch_one = stdout[first + 1 : texts.index("12/12 - loss: 0.1") + 1]
    assert 3 <= len(epoch_one) <= 7, texts
    assert epoch_one[0][1]["redraw"] is False and all(line["redraw"] for _, line in epoch_one[1:]), texts
    assert all("\b" not in line["text"] and "\r" not in line["text"] for _, line in stdout), texts
    # Some state reached the follower before the program printed the bar's last: the line moved live. (Not
    # the arrivals' spread: a coordinator slow to store the first lines of a task catches up within the bar.)
    ended_at = datetime.fromisoformat(epoch_one[-1][1]["at"].replace("Z", "+00:00")).timestamp()
    assert min(at for at, _ in epoch_one[:-1]) < ended_at, "the states came at the bar's end, not as it moved"
    # Epoch 2 redrew within a fraction of a second: its first state and its final one at most.
    epoch_two = texts[texts.index("Epoch 2/2") + 1 :]
    assert 1 <= len(epoch_two) <= 2 and epoch_two[-1] == "12/12 - loss: 0.2", texts
    assert "a warning" in [line["text"] for _, line in followed if line["stream"] == "stderr"]

    # Read afterwards, each line is as it ended: no superseded states, none marked.
    page = cluster.http.get(f"/api/v1/jobs/{job_id}/logs", params={"task": 0}).json()["lines"]
    assert [x["text"] for x in page if x["stream"] == "stdout"] == FINAL_LINES
    assert not any(x["redraw"] for x in page)
    every = cluster.http.get(f"/api/v1/jobs/{job_id}/logs", params={"task": 0, "replaced": "true"}).json()
    assert len(every["lines"]) > len(page)

    # The failure reason quotes final states, not the redraws.
    assert "12/12 - loss: 0.2" in job["reason"] and "boom after two epochs" in job["reason"], job["reason"]
    assert "1/12 [" not in job["reason"] and "5/12 [" not in job["reason"], job["reason"]

    # `mwms logs` to a pipe: final states; `-f` to a pipe of an ended job prints the same.
    for args in (["logs", job_id, "--task", "0"], ["logs", job_id, "--task", "0", "-f"]):
        printed = subprocess.run(
            [MWMS, *args], capture_output=True, text=True, env=cli_env(cluster), timeout=60
        )
        assert printed.returncode == 0, printed.stderr
        assert [
            x for x in printed.stdout.splitlines() if "warning" not in x and "boom" not in x
        ] == FINAL_LINES


def read_terminal(fd: int, until: float) -> bytes:
    data = b""
    while time.monotonic() < until:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the other side closed
            break
        if not chunk:
            break
        data += chunk
    return data


def test_on_a_terminal_logs_follow_overwrites_the_redrawn_line(cluster: Cluster) -> None:
    job_id = cluster.submit(
        {"progress.py": PROGRESS}, ["python", "progress.py"], workers=1, restart={"max_restarts": 0}
    )
    controller, terminal = pty.openpty()
    follower = subprocess.Popen(
        [MWMS, "logs", job_id, "--task", "0", "-f"],
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=subprocess.PIPE,
        env=cli_env(cluster),
    )
    os.close(terminal)
    try:
        shown = read_terminal(controller, time.monotonic() + 60)
        assert follower.wait(30) == 0, follower.stderr.read() if follower.stderr else ""
    finally:
        if follower.poll() is None:
            follower.kill()
        os.close(controller)
    # Each newer state erases the row the one before it took (cursor up, erase line) and is printed there.
    # In epoch 1 (3 s, the warning after its first state) at least two do: a later state over the one
    # after the warning, and the epoch's last line over that. How many of epoch 2's states (no pauses)
    # arrive apart depends on timing.
    erase = b"\x1b[1A\x1b[2K"
    assert shown.count(erase) >= 2, shown
    tail = shown.split(b"Epoch 2/2")[0]
    assert b"12/12 - loss: 0.1" in tail.split(erase)[-1], shown
    assert b"\x08" not in shown, shown


# tf-keras' own progress bar (fit(verbose=1)), slowed so an epoch lasts about 2.5 s.
KERAS_FIT = r"""
import os, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tf_keras as keras

class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.05)

x = np.random.rand(1000, 4).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.layers.Dense(1, input_shape=(4,))])
model.compile("sgd", "mse")
model.fit(x, y, batch_size=20, epochs=2, verbose=1, callbacks=[Slow()])
print("fit done", flush=True)
"""


@pytest.mark.tf
def test_a_keras_fit_progress_bar_moves_and_each_epoch_reads_as_one_line(cluster: Cluster) -> None:
    job_id = cluster.submit({"fit.py": KERAS_FIT}, ["python", "fit.py"], workers=1)
    followed = follow_api(cluster, job_id, timeout=180)
    job = cluster.wait_for(job_id, {"FAILED", "SUCCEEDED", "CANCELLED"}, timeout=60)
    assert job["state"] == "SUCCEEDED", job["reason"] + "\n" + cluster.logs_text(job_id)

    bars = [line for _, line in followed if line["stream"] == "stdout" and "/50 [" in line["text"]]
    assert all("\b" not in line["text"] and "\r" not in line["text"] for line in bars), bars
    # The first epoch's bar came in several states, each after the first replacing the one before it.
    first_epoch = bars[: [line["text"].startswith("50/50 [") for line in bars].index(True) + 1]
    assert len(first_epoch) >= 2 and all(line["redraw"] for line in first_epoch[1:]), first_epoch
    # Read afterwards: one line per epoch, its final state.
    page = [x["text"] for x in cluster.logs(job_id, 0) if x["stream"] == "stdout"]
    assert [text for text in page if "/50 [" in text] == [
        text for text in page if text.startswith("50/50 [==============================] - ")
    ], page
    assert len([text for text in page if "/50 [" in text]) == 2 and page[-1] == "fit done", page

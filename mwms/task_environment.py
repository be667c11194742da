"""The task environment: the variables a task's process gets from mwms, and which of them a job may set.

The agent builds every task's environment (worker_agent/task_env.py ``child_environment``) from its own
environment less its secrets and ``MWMS_*`` settings, then the job's ``env``, then the variables below.
The coordinator refuses at submit (HTTP 422) a job whose ``env`` names one the agent would overwrite;
mwms_runtime reads them inside the training program. The names fall in four kinds:

- **Reserved** (``RESERVED_ENV``): set by the agent for every task, whatever the job says, so a job may
  not set them: identity and shape (``MWMS_JOB_ID`` .. ``MWMS_NUM_GPUS``, ``MWMS_GPU_UUIDS``, ``TF_CONFIG``,
  ``CUDA_VISIBLE_DEVICES``), the task's directories (``MWMS_OUTPUT_DIR``, ``MWMS_CHECKPOINT_DIR``,
  ``MWMS_METRICS_FILE``, ``MWMS_STACKS_DIR``, ``TMPDIR``, ``PWD``), ``PYTHONUNBUFFERED=1`` (log lines arrive as
  they are printed), the preflight check's report file, and ``HOME``/``USER``/``LOGNAME``, which the
  agent sets for a task that runs as a user of its own (a job cannot know whether it will).
- **From the spec** (``SPEC_ENV``): the coordinator derives them from the job spec
  (server/services/job_life/jobs.py ``job_env``); a job sets the spec field named instead.
- **Defaulted** (``DEFAULTED_ENV``): a job may set them; the agent sets its default only when the job
  does not (``TF_USE_LEGACY_KERAS=1``, the tf_keras that MWMS's ``model.fit`` needs).
- **Merged** (``MERGED_ENV``): a job may set them; the agent puts its own entry first and keeps the
  job's after it (``PYTHONPATH``: the directory of mwms's task hooks, worker_agent/stack_handler, whose one
  ``sitecustomize`` installs the stack handler and the fit-metrics hook, then imports the next
  ``sitecustomize`` on the path, the job's own or the distribution's, as Python would have).

``TF_CONFIG`` is every task's, a single worker's too (``{"cluster": {"worker": ["host:port"]}, "task":
{"type": "worker", "index": 0}}``): TensorFlow's tutorials read ``json.loads(os.environ['TF_CONFIG'])``
whatever the gang's size, and MultiWorkerMirroredStrategy accepts a cluster of one.

The fit-metrics hook (worker_agent/stack_handler/_mwms_fit_metrics.py, mwms_runtime/auto_fit_metrics.py):
once a task imports tf_keras, every ``Model.fit`` gets mwms_runtime's ``MetricsCallback`` appended (unless
the program passes one), so fit's batch and epoch logs become the job's metrics (per step, and ``epoch_*``
per epoch) without a code change. ``MWMS_AUTO_METRICS=0`` in the job's env turns it off; if the hook
fails it prints one line and the program runs as it would without it.

Any other name is the job's to set, the runtime's knobs included (``RUNTIME_SETTINGS``).

Dependency-free (standard library only): the coordinator, the agent and mwms_runtime import it.
worker_agent/stack_handler/sitecustomize.py and _mwms_fit_metrics.py run inside the user's program and
import nothing of mwms at start: they spell ``MWMS_STACKS_DIR``, ``MWMS_METRICS_FILE`` and
``MWMS_AUTO_METRICS`` themselves, and tests tie those literals to the names here.
"""

from __future__ import annotations

from collections.abc import Iterable

from mwms.preflight_contract import ALLREDUCE_ENV, CONNECT_TIMEOUT_ENV, REPORT_ENV, TCP_MB_ENV

# --- reserved: set by the agent for every task ---
TF_CONFIG = "TF_CONFIG"  # the gang's cluster, a single worker's included (a cluster of one)
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"  # the GPUs given ("" on CPU)
JOB_ID = "MWMS_JOB_ID"
TASK_ID = "MWMS_TASK_ID"
ATTEMPT = "MWMS_ATTEMPT"
TASK_INDEX = "MWMS_TASK_INDEX"
NUM_WORKERS = "MWMS_NUM_WORKERS"
OUTPUT_DIR = "MWMS_OUTPUT_DIR"
CHECKPOINT_DIR = "MWMS_CHECKPOINT_DIR"
METRICS_FILE = "MWMS_METRICS_FILE"  # mwms/metrics_line.py is its format
DEVICE_KIND = "MWMS_DEVICE_KIND"  # DEVICE_KIND_GPU or DEVICE_KIND_CPU
NUM_GPUS = "MWMS_NUM_GPUS"
# The UUIDs of the task's GPUs, comma-separated in the order CUDA numbers them ("" on CPU); CUDA_VISIBLE_DEVICES
# names the same GPUs by the same UUIDs, which CUDA resolves inside a sandbox and outside it alike.
GPU_UUIDS = "MWMS_GPU_UUIDS"
STACKS_DIR = "MWMS_STACKS_DIR"  # where the stack handler writes dumps (worker_agent/stacks.py)
PREFLIGHT_REPORT = REPORT_ENV  # the preflight check's process only (mwms/preflight_contract.py)
TMPDIR = "TMPDIR"  # inside the task dir, removed with the task
PWD = "PWD"  # the task's working directory, its bundle (bubblewrap sets it too)
PYTHONUNBUFFERED = "PYTHONUNBUFFERED"
HOME = "HOME"  # HOME, USER, LOGNAME: for a task of its own user
USER = "USER"
LOGNAME = "LOGNAME"

DEVICE_KIND_GPU = "gpu"
DEVICE_KIND_CPU = "cpu"

RESERVED_ENV = frozenset(
    {
        TF_CONFIG,
        CUDA_VISIBLE_DEVICES,
        JOB_ID,
        TASK_ID,
        ATTEMPT,
        TASK_INDEX,
        NUM_WORKERS,
        OUTPUT_DIR,
        CHECKPOINT_DIR,
        METRICS_FILE,
        DEVICE_KIND,
        NUM_GPUS,
        GPU_UUIDS,
        STACKS_DIR,
        PREFLIGHT_REPORT,
        TMPDIR,
        PWD,
        PYTHONUNBUFFERED,
        HOME,
        USER,
        LOGNAME,
    }
)

# --- from the spec: the coordinator sets them from the job spec field named ---
COMMUNICATION = "MWMS_COMMUNICATION"
COLLECTIVE_TIMEOUT_S = "MWMS_COLLECTIVE_TIMEOUT_S"
BYTES_PER_PACK = "MWMS_BYTES_PER_PACK"
# Seconds between the SIGTERM that preempts (or drains) a task and the SIGKILL that follows it.
PREEMPTION_GRACE_S = "MWMS_PREEMPTION_GRACE_S"
SPEC_ENV: dict[str, str] = {
    COMMUNICATION: "communication.implementation",
    COLLECTIVE_TIMEOUT_S: "communication.timeout_seconds",
    BYTES_PER_PACK: "communication.bytes_per_pack",
    PREEMPTION_GRACE_S: "preemption_grace_seconds",
}

# The exit code of a task that was asked to stop for a preemption and saved a checkpoint first: what
# mwms_runtime's preemption handler exits with (TensorFlow's PreemptionCheckpointHandler default, 42).
# The coordinator records an attempt whose every task exited with it as "preempted and saved".
PREEMPTED_AND_SAVED_EXIT_CODE = 42
# The exit codes of a task whose command the agent could not execute, so it never started (a shell's
# codes for the same): not found, and found but not executable. The coordinator fails such a job at the
# first report, whatever its restart policy: no retry can make the command appear.
COMMAND_NOT_FOUND_EXIT_CODE = 127
COMMAND_NOT_EXECUTABLE_EXIT_CODE = 126
# The same for a task whose own Python environment cannot be built (a requirement that does not resolve,
# a package that does not build, a Python the agent does not have): no restart can help either.
ENVIRONMENT_NOT_BUILT_EXIT_CODE = 125

# --- defaulted: the job's value wins; the agent sets this one when the job gives none ---
USE_LEGACY_KERAS = "TF_USE_LEGACY_KERAS"
DEFAULTED_ENV: dict[str, str] = {USE_LEGACY_KERAS: "1"}

# --- merged: the agent's entry first, the job's (else the agent's own) after it ---
PYTHONPATH = "PYTHONPATH"
MERGED_ENV = frozenset({PYTHONPATH})

# --- the job's to set: what mwms_runtime reads besides the above ---
REPORT_TIMEOUT_S = "MWMS_REPORT_TIMEOUT_S"  # seconds one report() waits for the other workers
# "0": tf_keras fit does not get mwms_runtime's MetricsCallback added (worker_agent/stack_handler).
AUTO_METRICS = "MWMS_AUTO_METRICS"
RUNTIME_SETTINGS = frozenset({REPORT_TIMEOUT_S, AUTO_METRICS, CONNECT_TIMEOUT_ENV, TCP_MB_ENV, ALLREDUCE_ENV})


def refused_names(names: Iterable[str]) -> str | None:
    """One message naming every variable of `names` a job may not set (reserved ones first), or None."""
    given = set(names)
    reserved = sorted(given & RESERVED_ENV)
    parts = []
    if reserved:
        verb = "is" if len(reserved) == 1 else "are"
        parts.append(f"{', '.join(reserved)} {verb} set by mwms for each task and cannot be overridden")
    for name in sorted(given & SPEC_ENV.keys()):
        parts.append(f"{name} comes from the job spec: set {SPEC_ENV[name]} instead")
    return "; ".join(parts) or None

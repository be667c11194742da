"""The agent's defaults, in one place: worker_agent/config.py AgentConfig takes its field defaults from
here, and `mwms agent` (mwms/cli/daemons.py) passes only the options a user gave and shows these in --help.

Dependency-free (standard library only): `mwms --help` must not import the agent.
"""

from __future__ import annotations

SERVER = "127.0.0.1:50051"  # the coordinator's gRPC endpoint ("host:port"; several: comma-separated)
MAX_SERVERS = 32  # coordinator replicas one --server may list
WORK_DIR = "~/.mwms-agent"
SLOTS = 1  # CPU tasks at once
PORT_LOW, PORT_HIGH = 20000, 20999  # ports tasks may listen on, inclusive
# Under systemd (`mwms agent --systemd-unit`): the unit's StateDirectory=, never the caller's home.
SERVICE_WORK_DIR = "/var/lib/mwms-agent"
STOP_GRACE_S = 10.0  # between SIGTERM and SIGKILL when the agent stops its tasks (--stop-grace-seconds)
MAX_STOP_GRACE_S = 3600.0
# The unit's TimeoutStopSec= is the stop grace plus this: the agent's own shutdown after the grace
# (worker_agent/systemd.py says what it is spent on).
UNIT_STOP_MARGIN_S = 30
DEVICE_SAMPLE_INTERVAL_S = 5.0  # GPU samples; 0: none
# Jobs' own Python environments (worker_agent/environments.py): the cache's size, least recently used
# evicted first (0: unbounded), and how long one build may take.
ENV_CACHE_BYTES = 20 * 1024**3
ENV_BUILD_TIMEOUT_S = 1800.0
MAX_ENV_BUILD_TIMEOUT_S = 6 * 3600.0
SANDBOX = "auto"
SANDBOX_MODES = ("auto", "bwrap", "off")
TASK_UID_LOW, TASK_UID_HIGH = 60000, 60999  # uids of tasks when the agent is root, inclusive
# Each task's limits (worker_agent/task_limits.py): processes and threads (its cgroup's pids.max), and
# the size of its own files (output, checkpoints, home, temp); 0: none.
TASK_PIDS_MAX = 4096
MAX_TASK_PIDS = 4_194_304  # the kernel's own pid_max ceiling
TASK_DISK_MAX = 64 * 1024**3
# Warm interpreters (TensorFlow imported, waiting for one task each) an agent keeps (worker_agent/warm_pool.py).
WARM_POOL = 1
MAX_WARM_POOL = 64
# The agent's own oom_score_adj (its unit's OOMScoreAdjust=): the kernel kills tasks (1000) first.
AGENT_OOM_SCORE_ADJ = -900


def port_range() -> str:
    """The default --port-range as the CLI spells it."""
    return f"{PORT_LOW}-{PORT_HIGH}"


def task_uid_range() -> str:
    """The default --task-uids as the CLI spells it."""
    return f"{TASK_UID_LOW}-{TASK_UID_HIGH}"

"""What tests running side by side must not share on this host.

`make test` runs the suite in pytest-xdist workers (gw0, gw1, ...), each a whole test module at a time. Two
modules on different workers may start agents at the same moment, and two agents of different coordinators
on one host must not hand out the same task ports or task uids: a task of one would squat or reach a port
of the other, or share a uid with it. Each worker gets a block of its own: the port ranges the tests name
(20000-25999) and the uid ranges they hand out themselves are shifted by the worker's index. Agents' own
task uids need nothing: they are locked host-wide (/run/mwms/task-uids), as between agents of one machine.
"""

from __future__ import annotations

import os

# The task port ranges the tests name lie in [PORTS_LOW, PORTS_LOW + PORT_BLOCK); worker N uses the block
# PORT_BLOCK * N below it, so three workers stay above 8000 and below the kernel's ephemeral range.
PORTS_LOW = 20_000
PORT_BLOCK = 6_000
# Uid ranges the tests hand out themselves (free_uid_range: 61000 and up) move up by UID_BLOCK per worker.
UID_BLOCK = 2_000
MAX_WORKERS = 3


def worker_index() -> int:
    """0 outside pytest-xdist, else N for worker gwN."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not name:
        return 0
    index = int(name.removeprefix("gw"))
    if index >= MAX_WORKERS:
        raise RuntimeError(
            f"pytest-xdist worker {name}: at most {MAX_WORKERS} workers have port and uid blocks of "
            "their own (mwms_testkit/parallel.py); run with -n 3 or fewer"
        )
    return index


def task_ports(low: int) -> int:
    """The first port of a task port range a test names as starting at `low`, on this worker."""
    if PORTS_LOW <= low < PORTS_LOW + PORT_BLOCK:
        return low - PORT_BLOCK * worker_index()
    return low


def port_range(low: int, size: int = 100) -> str:
    """`--port-range` for `size` ports from `low` (task_ports applied)."""
    first = task_ports(low)
    return f"{first}-{first + size - 1}"


def task_uids(low: int) -> int:
    """The first uid of a range a test hands out itself from `low`, on this worker."""
    return low + UID_BLOCK * worker_index()


def free_uid_range(size: int) -> tuple[int, int]:
    """A range of `size` uids with no account and nothing left of them on this host (a process, an IPC
    object, a file in /tmp: TaskUsers would skip such a uid), in this worker's block, for tests that hand
    uids out themselves."""
    import pwd

    from mwms.worker_agent.task_users import leftovers_of

    taken = {entry.pw_uid for entry in pwd.getpwall()}
    low = task_uids(61_000)
    while any(uid in taken or leftovers_of(uid) for uid in range(low, low + size)):
        low += size
    return low, low + size - 1


class AloneLock:
    """Lets a test marked `alone` (one that bounds latencies or durations, which a TensorFlow job on the
    other worker would stretch) run while no other worker runs a test; every other test runs beside
    each other as usual. Two files locked by the workers of one run: every test passes through the
    turnstile, then holds the room shared; an `alone` test holds the turnstile while it waits for the
    room alone, so the other worker's next test waits for it instead of starving it. POSIX record locks
    (lockf), not flock(2): a child a test forks does not inherit them, so none outlives its worker's test."""

    def __init__(self, directory: str, run_id: str) -> None:
        self._turnstile = os.path.join(directory, f"mwms-tests-{run_id}.turnstile")
        self._room = os.path.join(directory, f"mwms-tests-{run_id}.room")
        self._held: list[int] = []

    def acquire(self, alone: bool) -> None:
        import fcntl

        turnstile = os.open(self._turnstile, os.O_CREAT | os.O_RDWR, 0o600)
        room = os.open(self._room, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.lockf(turnstile, fcntl.LOCK_EX)
        if alone:
            fcntl.lockf(room, fcntl.LOCK_EX)
            self._held = [room, turnstile]
            return
        fcntl.lockf(room, fcntl.LOCK_SH)
        os.close(turnstile)
        self._held = [room]

    def release(self) -> None:
        for descriptor in self._held:
            os.close(descriptor)  # closing it releases this process's lock on the file
        self._held = []


# Modules that took longest in `make test` (tests/system, --durations of a clean-clone run, 2026-12-06), in
# that order. pytest-xdist hands each worker the next module in collection order as it frees up, so these
# go first and the many short modules of tests/unit and tests/integration last, filling the tail: the two
# workers then end within seconds of each other instead of one waiting for the other's long module.
SLOWEST_FIRST = (
    "system/e2e/test_fault_tolerance.py",
    "system/deploy/test_packaging.py",
    "system/runtime/test_runtime_preemption.py",
    "system/runtime/test_runtime_workers.py",
    "system/e2e/test_stacks_and_hangs.py",
    "system/e2e/test_replicas.py",
    "system/e2e/test_network_partition.py",
    "system/browser/test_dashboard_e2e.py",
    "system/e2e/test_preflight.py",
    "system/e2e/test_api_fuzz.py",
    "system/e2e/test_preemption.py",
    "system/e2e/test_openapi_contract.py",
    "system/e2e/test_network_confinement.py",
    "system/e2e/test_job_environments.py",
)
TIER_ORDER = ("system", "integration", "unit")  # after SLOWEST_FIRST: processes, then in-process tests


def schedule_rank(relative_path: str) -> tuple[int, int]:
    """Where a test module (its path under tests/, with /) goes in the order the workers take modules."""
    if relative_path in SLOWEST_FIRST:
        return 0, SLOWEST_FIRST.index(relative_path)
    tier = relative_path.split("/", 1)[0]
    return 1 + (TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER)), 0

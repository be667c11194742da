"""The tasks' seccomp filter (worker_agent/seccomp.py) under a real bubblewrap: what it refuses (new user
namespaces, keyrings, io_uring, mounts, clone3, foreign ABIs...) and what TensorFlow-style work still does
(threads, fork, multiprocessing pools, POSIX semaphores, affinity, NUMA calls, loopback sockets,
faulthandler, numpy, TensorFlow). Each probe runs inside `bwrap --seccomp FD`, dropped to another uid by
setpriv as the agent drops a task (root), beside the same probe without the filter (which shows that the
refusals come from the filter, not from the missing capabilities), and once as root with the capabilities
bwrap leaves root."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mwms.worker_agent import seccomp
from mwms.worker_agent.sandbox import closed_ancestor, needed_paths
from mwms.worker_agent.stacks import py_spy_executable, take_stacks

BWRAP = shutil.which("bwrap")
SETPRIV = shutil.which("setpriv")
ROOT = os.geteuid() == 0
TASK_UID = 61234
X86_64 = platform.machine() == "x86_64"

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="seccomp is Linux's"),
    pytest.mark.skipif(bool(seccomp.available()), reason=f"no seccomp filter here: {seccomp.available()}"),
]
needs_bwrap = pytest.mark.skipif(BWRAP is None, reason="bubblewrap (bwrap) is not installed")
needs_root = pytest.mark.skipif(
    not ROOT or SETPRIV is None, reason="dropping to a task uid with setpriv needs root and util-linux"
)

# Syscalls the probe makes by number (resolved here for this architecture by libseccomp).
PROBED = (
    "clone",
    "clone3",
    "keyctl",
    "io_uring_setup",
    "setns",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "personality",
    "ptrace",
    "settimeofday",
    "get_mempolicy",
    "set_mempolicy",
)

# Run inside the sandbox: each check gives "ok" (or a value), an errno name, or how a child died.
PROBE = r"""
import ctypes, errno, faulthandler, json, mmap, multiprocessing, os, signal, socket, subprocess, sys
from concurrent.futures import ThreadPoolExecutor

numbers = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SIGCHLD = int(signal.SIGCHLD)
CLONE_NEWUSER = 0x10000000
results = {}


def arg(value):
    return value if isinstance(value, ctypes._SimpleCData) else ctypes.c_long(value)


def raw(name, *args):
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(numbers[name]), *map(arg, args))
    return result, ctypes.get_errno()


def outcome(result, code):
    return "ok" if result >= 0 else errno.errorcode.get(code, str(code))


def forking(result, code):
    # A clone that succeeded made a child running this very code: it leaves at once.
    if result == 0:
        os._exit(0)
    if result > 0:
        os.waitpid(result, 0)
    return outcome(result, code)


def in_child(check):
    # `check` in a forked child (it may change the process or kill it); its answer or how it died.
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            libc.prctl(4, 0)  # PR_SET_DUMPABLE 0: a child killed by SIGSYS writes no core
            answer = str(check())
        except BaseException as error:
            answer = f"{type(error).__name__}: {error}"
        os.write(write_end, answer.encode())
        os._exit(0)
    os.close(write_end)
    answer = b""
    while chunk := os.read(read_end, 4096):
        answer += chunk
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return answer.decode()


def check(name, function):
    try:
        results[name] = function()
    except BaseException as error:
        results[name] = f"{type(error).__name__}: {error}"


def clone3():
    args = (ctypes.c_uint64 * 11)()
    args[4] = SIGCHLD  # exit_signal: a plain fork
    return forking(*raw("clone3", ctypes.addressof(args), ctypes.c_long(ctypes.sizeof(args))))


def unshare_user():
    ctypes.set_errno(0)
    return outcome(libc.unshare(CLONE_NEWUSER), ctypes.get_errno())


def io_uring():
    params = ctypes.create_string_buffer(120)
    return outcome(*raw("io_uring_setup", 1, ctypes.addressof(params)))


def setns():
    fd = os.open("/proc/self/ns/uts", os.O_RDONLY)
    return outcome(*raw("setns", fd, 0))


def bpf():
    attr = ctypes.create_string_buffer(128)
    return outcome(*raw("bpf", 0, ctypes.addressof(attr), 128))  # BPF_MAP_CREATE


def perf_event():
    attr = (ctypes.c_uint64 * 16)()
    attr[0] = 1 | (128 << 32)  # type PERF_TYPE_SOFTWARE, size 128; config 0: the task clock
    attr[5] = 0x1 | 0x20 | 0x40  # disabled, exclude_kernel, exclude_hv
    return outcome(*raw("perf_event_open", ctypes.addressof(attr), 0, -1, -1, 0))


def mount():
    ctypes.set_errno(0)
    return outcome(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None), ctypes.get_errno())


def chroot():
    ctypes.set_errno(0)
    return outcome(libc.chroot(b"/"), ctypes.get_errno())


def personality(value):
    return lambda: outcome(*raw("personality", ctypes.c_ulong(value)))


def foreign_abi(code):
    # Machine code that makes one syscall through another ABI (x86_64 only), run in a child.
    def run():
        memory = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        memory.write(code)
        function = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(memory)))
        return f"returned {function()}"
    return run


# What the filter refuses (or not, without it).
check("clone_newuser", lambda: forking(*raw("clone", CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)))
check("clone_plain", lambda: forking(*raw("clone", SIGCHLD, 0, 0, 0, 0)))
check("clone3", clone3)
check("unshare_newuser", lambda: in_child(unshare_user))
if hasattr(os, "unshare"):  # Python 3.12+
    check("os_unshare", lambda: in_child(lambda: os.unshare(os.CLONE_NEWUSER) or "ok"))
done = subprocess.run(["unshare", "-U", "true"], capture_output=True, text=True)
results["unshare_tool"] = f"exit {done.returncode}: {done.stderr.strip()}"
check("keyctl", lambda: outcome(*raw("keyctl", 0, -3, 0)))  # KEYCTL_GET_KEYRING_ID, the session keyring
check("io_uring_setup", lambda: in_child(io_uring))
check("setns", setns)
check("mount", lambda: in_child(mount))
check("chroot", lambda: in_child(chroot))
check("bpf", bpf)
check("perf_event_open", lambda: in_child(perf_event))
check("userfaultfd", lambda: outcome(*raw("userfaultfd", os.O_CLOEXEC | 1)))  # UFFD_USER_MODE_ONLY
check("ptrace_traceme", lambda: in_child(lambda: outcome(*raw("ptrace", 0, 0, 0, 0))))
check("personality_query", personality(0xFFFFFFFF))
check("personality_linux", lambda: in_child(personality(0)))
check("personality_linux32", lambda: in_child(personality(0x0008)))
check("personality_no_aslr", lambda: in_child(personality(0x0040000)))
check("settimeofday_noop", lambda: outcome(*raw("settimeofday", 0, 0)))
check("socket_alg", lambda: socket.socket(38, socket.SOCK_SEQPACKET, 0).close() or "ok")
if numbers["x86_64"]:
    # getpid through the 32-bit entry (int 0x80, eax 20), then through x32 (eax 0x40000000 + 39).
    check("int80", lambda: in_child(foreign_abi(b"\xb8\x14\x00\x00\x00\xcd\x80\xc3")))
    check("x32", lambda: in_child(foreign_abi(b"\xb8\x27\x00\x00\x40\x0f\x05\xc3")))

# What tasks do.
with ThreadPoolExecutor(8) as pool:
    results["threads"] = sum(pool.map(lambda n: n * n, range(100)))
pid = os.fork()
if pid == 0:
    os._exit(7)
results["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
results["subprocess"] = subprocess.run(["sh", "-c", "exit 3"]).returncode
for method in ("fork", "spawn"):
    with multiprocessing.get_context(method).Pool(2) as pool:
        results[f"pool_{method}"] = pool.map(abs, [-1, -2, -3])
lock = multiprocessing.Lock()
with lock:
    results["semaphore"] = "ok"
os.sched_setaffinity(0, os.sched_getaffinity(0))
results["affinity"] = sorted(os.sched_getaffinity(0))
anonymous = mmap.mmap(-1, 1 << 20)
anonymous[:5] = b"hello"
with open("/tmp/mapped", "w+b") as f:
    f.write(b"\0" * 4096)
    f.flush()
    mapped = mmap.mmap(f.fileno(), 4096)
    mapped[:5] = anonymous[:5]
    results["mmap"] = mapped[:5].decode()
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
client = socket.create_connection(server.getsockname())
accepted, _ = server.accept()
client.sendall(b"ping")
results["tcp_loopback"] = accepted.recv(4).decode()
left, right = socket.socketpair()
left.sendall(b"pong")
results["unix_pair"] = right.recv(4).decode()
with open("/tmp/stacks.txt", "w+") as f:
    faulthandler.dump_traceback(f, all_threads=True)
    f.seek(0)
    results["faulthandler"] = "File" in f.read()
check("get_mempolicy", lambda: outcome(*raw("get_mempolicy", 0, 0, 0, 0, 0)))
check("set_mempolicy", lambda: outcome(*raw("set_mempolicy", 0, 0, 0)))  # MPOL_DEFAULT
try:
    import numpy
    results["numpy"] = float(numpy.arange(4.0) @ numpy.arange(4.0))
except ImportError:
    results["numpy"] = None
results["uid"] = os.getuid()
with open("/proc/self/status") as f:
    status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
results["seccomp_mode"] = status.get("Seccomp", "").strip()
results["cap_eff"] = int(status.get("CapEff", "0"), 16)
print("RESULTS " + json.dumps(results))
"""

TF_PROGRAM = r"""
import json
import tensorflow as tf
tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(2)
dataset = tf.data.Dataset.range(64).map(lambda x: x * 2, num_parallel_calls=4).batch(8).prefetch(2)
total = sum(int(tf.reduce_sum(batch)) for batch in dataset)

@tf.function
def step(a):
    return tf.linalg.matmul(a, a)

value = float(step(tf.ones((64, 64)))[0, 0])
print("RESULTS " + json.dumps({"total": total, "value": value}))
"""

SETPRIV_ARGS = [
    f"--reuid={TASK_UID}",
    f"--regid={TASK_UID}",
    "--clear-groups",
    "--inh-caps=-all",
    "--bounding-set=-all",
    "--",
]


def python_binds() -> list[str]:
    """What a task user needs to run this Python, as worker_agent/sandbox.py binds it: directories closed to
    other users above the interpreter and its packages (a pyenv under /root) masked by an empty tmpfs, and
    the needed directories bound back read-only."""
    needed = needed_paths()
    closed = sorted({a for a in map(closed_ancestor, needed) if a is not None}, key=lambda p: len(p.parts))
    args: list[str] = []
    for mask in closed:
        args += ["--perms", "0755", "--tmpfs", str(mask)]
    for path in needed:
        covering = [mask for mask in closed if mask == path or mask in path.parents]
        if covering:
            # The directories bwrap would create between the mask and the bind are 0700: made 0755 here.
            for directory in reversed(path.parents):
                if covering[-1] in directory.parents:
                    args += ["--perms", "0755", "--dir", str(directory)]
            args += ["--ro-bind", str(path), str(path)]
    return args


def sandbox_argv(program: list[str], fd: int | None, drop: bool = True) -> list[str]:
    """`program` as a task runs: in bwrap (read-only system, fresh /proc and /dev, private /tmp and
    /dev/shm, own PID namespace) with the filter read from `fd` (None: no filter), dropped to TASK_UID by
    setpriv where `drop` (and this is root)."""
    assert BWRAP is not None
    argv = [BWRAP, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
    argv += ["--perms", "1777", "--tmpfs", "/tmp", "--perms", "1777", "--tmpfs", "/dev/shm", *python_binds()]
    argv.append("--unshare-pid")
    if fd is not None:
        argv += seccomp.bwrap_options(fd)
    argv.append("--")
    if drop and ROOT:
        assert SETPRIV is not None
        argv += [SETPRIV, *SETPRIV_ARGS]
    return argv + program


TASK_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", "LANG": "C.UTF-8"}


def sandboxed(
    program: list[str], *, with_filter: bool = True, drop: bool = True, timeout: float = 180
) -> Any:
    """Runs `program` in the sandbox (sandbox_argv); the JSON it printed after RESULTS."""
    fd = seccomp.filter_fd() if with_filter else None
    try:
        done = subprocess.run(
            sandbox_argv(program, fd, drop),
            pass_fds=() if fd is None else (fd,),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=TASK_ENV,
            check=False,
        )
    finally:
        if fd is not None:
            os.close(fd)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    assert done.returncode == 0 and lines, (
        f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return json.loads(lines[-1].removeprefix("RESULTS "))


def probe(**options: Any) -> dict[str, Any]:
    numbers: dict[str, Any] = {name: seccomp.syscall_number(name) for name in PROBED}
    numbers["x86_64"] = X86_64
    result: dict[str, Any] = sandboxed([sys.executable, "-c", PROBE, json.dumps(numbers)], **options)
    return result


@pytest.fixture(scope="module")
def filtered() -> dict[str, Any]:
    """The probe as a task: the filter, and (root) another uid without capabilities."""
    return probe()


@pytest.fixture(scope="module")
def unfiltered() -> dict[str, Any]:
    """The same probe without the filter: what the kernel alone allows that task."""
    return probe(with_filter=False)


def sysctl(name: str) -> str:
    try:
        return Path("/proc/sys", *name.split(".")).read_text().strip()
    except OSError:
        return ""


# The filter itself.


def test_the_filter_is_a_bpf_program_built_once() -> None:
    program = seccomp.task_filter()
    assert program and len(program) % 8 == 0
    assert len(program) // 8 < 4096  # the kernel's limit (BPF_MAXINSNS)
    assert seccomp.task_filter() is program
    assert seccomp.available() == ""
    # Names the architecture lacks are skipped, never the ones that matter on it.
    for name in ("unshare", "clone", "clone3", "keyctl", "io_uring_setup", "mount", "setns", "ptrace"):
        assert name not in seccomp.skipped()
        assert seccomp.syscall_number(name) is not None
    if X86_64:
        assert {"vm86", "vm86old", "stime"} <= set(seccomp.skipped())


def test_each_fd_is_a_fresh_sealed_inheritable_copy_at_offset_zero() -> None:
    first, second = seccomp.filter_fd(), seccomp.filter_fd()
    try:
        assert first != second
        assert os.get_inheritable(first) and os.get_inheritable(second)
        assert os.lseek(first, 0, os.SEEK_CUR) == 0
        assert os.read(first, 1 << 20) == seccomp.task_filter()
        # Reading one (as a bwrap does) leaves the other at its start.
        assert os.read(second, 1 << 20) == seccomp.task_filter()
        with pytest.raises(PermissionError):
            os.pwrite(first, b"\0" * 8, 0)
        assert fcntl.fcntl(first, fcntl.F_GET_SEALS) & fcntl.F_SEAL_WRITE
    finally:
        os.close(first)
        os.close(second)
    with seccomp.filter_file() as fd:
        assert os.pread(fd, 8, 0) == seccomp.task_filter()[:8]
    with pytest.raises(OSError):
        os.fstat(fd)


# What a task may not do.


@needs_bwrap
def test_a_task_cannot_make_a_user_namespace(filtered: dict[str, Any]) -> None:
    assert filtered["seccomp_mode"] == "2"
    assert filtered["clone_newuser"] == "EPERM"
    assert filtered["unshare_newuser"] == "EPERM"
    if "os_unshare" in filtered:
        assert filtered["os_unshare"].startswith("PermissionError")
    code, _, said = filtered["unshare_tool"].partition(": ")
    assert code != "exit 0" and "Operation not permitted" in said
    assert filtered["setns"] == "EPERM"
    # clone3's flags cannot be checked: ENOSYS, so that glibc falls back to clone.
    assert filtered["clone3"] == "ENOSYS"
    assert filtered["clone_plain"] == "ok"


@needs_bwrap
def test_a_task_cannot_reach_keyrings_io_uring_mounts_or_the_kernel(filtered: dict[str, Any]) -> None:
    for name in (
        "keyctl",
        "io_uring_setup",
        "mount",
        "chroot",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "ptrace_traceme",
        "settimeofday_noop",
        "socket_alg",
    ):
        assert filtered[name] in ("EPERM", "PermissionError: [Errno 1] Operation not permitted"), name


@needs_bwrap
def test_personality_allows_dockers_values_only(filtered: dict[str, Any]) -> None:
    assert filtered["personality_query"] == "ok"
    assert filtered["personality_linux"] == "ok"
    assert filtered["personality_linux32"] == "ok"
    assert filtered["personality_no_aslr"] == "EPERM"


@needs_bwrap
@pytest.mark.skipif(not X86_64, reason="the 32-bit and x32 entries are x86_64's")
def test_a_syscall_through_another_abi_kills_the_process(filtered: dict[str, Any]) -> None:
    assert filtered["int80"] == "signal SIGSYS"
    assert filtered["x32"] == "signal SIGSYS"


@needs_bwrap
@needs_root
def test_without_the_filter_the_same_task_could(unfiltered: dict[str, Any], filtered: dict[str, Any]) -> None:
    """The refusals above come from the filter: the kernel alone lets the same unprivileged task do them."""
    assert unfiltered["seccomp_mode"] == "0" and unfiltered["uid"] == filtered["uid"] == TASK_UID
    assert unfiltered["keyctl"] == "ok"
    assert unfiltered["clone3"] == "ok"
    assert unfiltered["ptrace_traceme"] == "ok"
    assert unfiltered["personality_no_aslr"] == "ok"
    if sysctl("kernel.io_uring_disabled") in ("", "0"):
        assert unfiltered["io_uring_setup"] == "ok"
    if (
        sysctl("user.max_user_namespaces") not in ("", "0")
        and sysctl("kernel.unprivileged_userns_clone") != "0"
    ):
        assert unfiltered["clone_newuser"] == "ok"
        assert unfiltered["unshare_newuser"] == "ok"
        assert unfiltered["unshare_tool"].startswith("exit 0")
    # What no unprivileged task may do anyway: refused either way.
    assert unfiltered["mount"] == "EPERM" and unfiltered["setns"] == "EPERM"


@needs_bwrap
@needs_root
def test_root_inside_the_sandbox_is_refused_too() -> None:
    """bwrap leaves root its capabilities (a task that shares a root agent's identity): the filter still
    refuses it a user namespace, mounts, keyrings, chroot and the clock."""
    root = probe(drop=False)
    assert root["uid"] == 0 and root["cap_eff"] & (1 << 21)  # CAP_SYS_ADMIN
    assert root["unshare_newuser"] == "EPERM" and root["clone_newuser"] == "EPERM"
    assert not root["unshare_tool"].startswith("exit 0")
    for name in ("mount", "chroot", "keyctl", "setns", "settimeofday_noop", "io_uring_setup", "bpf"):
        assert root[name] == "EPERM", name
    assert root["clone3"] == "ENOSYS"


# What a task still does.


@needs_bwrap
def test_a_task_still_runs_threads_processes_pools_sockets_and_numa_calls(filtered: dict[str, Any]) -> None:
    if ROOT:
        assert filtered["uid"] == TASK_UID and filtered["cap_eff"] == 0
    assert filtered["threads"] == sum(n * n for n in range(100))
    assert filtered["fork"] == 7
    assert filtered["subprocess"] == 3
    assert filtered["pool_fork"] == filtered["pool_spawn"] == [1, 2, 3]
    assert filtered["semaphore"] == "ok"
    assert filtered["affinity"] == sorted(os.sched_getaffinity(0))
    assert filtered["mmap"] == "hello"
    assert filtered["tcp_loopback"] == "ping" and filtered["unix_pair"] == "pong"
    assert filtered["faulthandler"] is True
    # NUMA policy calls are kept (ENOSYS only on a kernel built without NUMA).
    assert filtered["get_mempolicy"] in ("ok", "ENOSYS")
    assert filtered["set_mempolicy"] in ("ok", "ENOSYS")
    try:
        import numpy  # noqa: F401
    except ImportError:
        return
    assert filtered["numpy"] == 14.0


def tensorflow_installed() -> bool:
    try:
        import importlib.util

        return importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):
        return False


@needs_bwrap
@pytest.mark.tf
@pytest.mark.skipif(not tensorflow_installed(), reason="TensorFlow is not installed")
def test_tensorflow_runs_under_the_filter() -> None:
    result = sandboxed([sys.executable, "-c", TF_PROGRAM], timeout=300)
    assert result == {"total": 2 * sum(range(64)), "value": 64.0}


SLEEPER = """
import time

def waiting_in_the_sandbox():
    time.sleep(120)

print("ready", flush=True)
waiting_in_the_sandbox()
"""


@needs_bwrap
@needs_root
@pytest.mark.skipif(py_spy_executable() is None, reason="py-spy is not installed")
def test_the_agents_py_spy_still_dumps_a_filtered_tasks_stacks() -> None:
    """ptrace is denied inside the task, not to the agent: its py-spy, outside the filter, reads the
    stacks as before (the same path a DumpStacks command takes)."""
    with seccomp.filter_file() as fd:
        process = subprocess.Popen(
            sandbox_argv([sys.executable, "-c", SLEEPER], fd),
            pass_fds=(fd,),
            stdout=subprocess.PIPE,
            env=TASK_ENV,
            start_new_session=True,
        )
    try:
        assert process.stdout is not None and process.stdout.readline() == b"ready\n"
        taken = take_stacks(process.pid, None, "py-spy")
        if "Operation not permitted" in taken.error or "ptrace" in taken.error.lower():
            pytest.skip(f"this machine lets no one trace: {taken.error}")
        assert taken.error == "" and taken.method == "py-spy"
        assert "waiting_in_the_sandbox" in taken.text
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture
def _no_leaked_fds() -> Iterator[None]:
    before = set(os.listdir("/proc/self/fd"))
    yield
    assert set(os.listdir("/proc/self/fd")) <= before


@needs_bwrap
def test_a_launch_closes_its_fd(_no_leaked_fds: None) -> None:
    with seccomp.filter_file() as fd:
        done = subprocess.run(
            [
                BWRAP or "bwrap",
                "--ro-bind",
                "/",
                "/",
                "--dev",
                "/dev",
                *seccomp.bwrap_options(fd),
                "--",
                "true",
            ],
            pass_fds=(fd,),
            check=False,
        )
    assert done.returncode == 0


def test_errno_actions_encode_like_libseccomp() -> None:
    assert seccomp.action_errno(errno.EPERM) == 0x00050001
    assert seccomp.action_errno(errno.ENOSYS) == 0x00050026

"""A warm interpreter: imports TensorFlow, then waits for its one task and runs it as `python <file>.py` would.

Run by path (`python .../warm_interpreter.py FD`) by the agent's warm pool (worker_agent/warm_pool.py), in
the sandbox, uid and cgroup its task will have. FD is a unix socket shared with the agent: once TensorFlow
(and tf_keras) are imported it writes "ready"; the agent then writes the task as one JSON object
({"env", "cwd", "argv"}) and closes its side. Nothing of a job runs before that.

The task then runs as the program's `__main__`, as CPython runs a script: the environment replaced
wholesale, the working directory, `sys.argv` (the program's path as the job wrote it, then its arguments),
`sys.path[0]` (the program's real directory), `__file__` (its absolute path), the default signal handling
and the exit codes (SystemExit's; an uncaught exception prints its traceback and exits 1). The agent owns
the process as a cold task's: SIGTERM, then SIGKILL, reach the program itself. Imports only the standard
library of its own (it runs in the job's process, on the job's sys.path).
"""

import importlib.machinery
import json
import os
import socket
import sys
import tempfile
import types


def _warm_up() -> None:
    """Imports what every MWMS program imports first; never lists devices (that would initialise CUDA
    before the task's CUDA_VISIBLE_DEVICES is set)."""
    import tensorflow  # noqa: F401

    try:
        import tf_keras  # noqa: F401
    except ImportError:
        pass  # tf.keras (Keras 3) then; the task imports whatever it imports


def _wait_for_task(channel: socket.socket) -> dict:
    try:
        channel.sendall(b"ready\n")
    except OSError:
        pass  # handed its task while importing: the agent wrote it and closed its side; it is still here
    chunks = []
    while True:
        chunk = channel.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
    channel.close()
    if not chunks:
        sys.exit(0)  # the agent gave this interpreter up (or ended): nothing ran, nothing to say
    return json.loads(b"".join(chunks))


def _enter(task: dict) -> str:
    """Takes on the task's environment, directory and argv; returns the program's path as given."""
    os.environ.clear()
    os.environ.update(task["env"])
    tempfile.tempdir = None  # found again from the task's TMPDIR, should TensorFlow's import have asked
    os.chdir(task["cwd"])
    sys.argv = list(task["argv"])
    sys.orig_argv = [sys.orig_argv[0], *sys.argv]
    return sys.argv[0]


def _run_as_main(program: str) -> None:
    """Runs `program` as CPython's `python program` does (runpy.run_path would set sys.argv[0] to the
    path it is given, and restore the previous `__main__` afterwards, which atexit handlers still need)."""
    path = os.path.abspath(program)
    try:
        with open(path, "rb") as file:
            source = file.read()
    except OSError as error:
        print(
            f"{sys.executable}: can't open file {path!r}: [Errno {error.errno}] {error.strerror}",
            file=sys.stderr,
        )
        sys.exit(2)
    sys.path[0:0] = [os.path.dirname(os.path.realpath(path))]
    main = types.ModuleType("__main__")
    loader = importlib.machinery.SourceFileLoader("__main__", path)
    main.__dict__.update(
        __file__=path,
        __cached__=None,
        __package__=None,
        __spec__=None,
        __loader__=loader,
        __builtins__=__builtins__,
    )
    sys.modules["__main__"] = main
    code = compile(source, path, "exec", dont_inherit=True)
    try:
        exec(code, main.__dict__)
    except SystemExit:
        raise
    except BaseException as error:
        # The program's frames only, as a cold start shows them.
        traceback = error.__traceback__.tb_next if error.__traceback__ is not None else None
        sys.excepthook(type(error), error.with_traceback(traceback), traceback)
        if isinstance(error, KeyboardInterrupt):
            import signal

            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        sys.exit(1)


def main() -> None:
    channel = socket.socket(fileno=int(sys.argv[1]))
    # sys.path[0] is this file's directory: the agent's modules must not shadow the job's.
    del sys.path[0]
    _warm_up()
    program = _enter(_wait_for_task(channel))
    _run_as_main(program)


if __name__ == "__main__":
    main()

"""Put on every task's PYTHONPATH by the mwms agent: lets the agent take the task's Python stacks.

The one `sitecustomize` of mwms in a task: it also loads this directory's other task hooks
(``_mwms_fit_metrics``: tf_keras fit's logs as metrics), each of which never stops the program.

When MWMS_STACKS_DIR is set, registers faulthandler on SIGUSR2 so that the signal writes the stacks of
every thread (innermost frame first) to <MWMS_STACKS_DIR>/<pid>.txt; the file existing tells the agent
that this process answers the signal. The program itself is not changed: afterwards the next
`sitecustomize` on sys.path (a user's or the distribution's own) is imported as it would have been.

Depends on nothing but the standard library (it runs inside the user's program); the agent's side of
the contract is worker_agent/stacks.py.
"""

import os
import sys


def _install_stack_handler() -> None:
    directory = os.environ.get("MWMS_STACKS_DIR")
    if not directory:
        return
    import faulthandler
    import signal

    signum = signal.SIGUSR2
    # Chaining to the default action would end the process after each dump: chain only to a real handler.
    previous = signal.getsignal(signum)
    chain = previous not in (signal.SIG_DFL, signal.SIG_IGN, None)
    try:
        target = open(os.path.join(directory, f"{os.getpid()}.txt"), "a")  # open for the life of the process
        faulthandler.register(signum, file=target, all_threads=True, chain=chain)
    except (OSError, RuntimeError, ValueError):
        pass  # no dump on demand for this process; the program runs as ever


def _import_next_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _install_task_hooks() -> None:
    try:
        import _mwms_fit_metrics

        _mwms_fit_metrics.install()
    except Exception:  # noqa: BLE001, S110 - the hook says why itself where it can; the program runs as ever
        pass


_install_stack_handler()
_install_task_hooks()
_import_next_sitecustomize()

"""A task that failed on an import it could not make: which module, and where the job should add it.

Python's last line of an uncaught ModuleNotFoundError is read from the task's stderr as it comes; when the
task then fails, its reason names the module and says whether the job's environment was isolated, the
one fact a user needs to fix it (add the package, or extend the agents' runtime).
"""

from __future__ import annotations

import re

from mwms.worker_agent.environments import Environment

_MISSING = re.compile(r"ModuleNotFoundError: No module named '([A-Za-z0-9_.]{1,200})'")


def missing_module(line: str) -> str | None:
    """The module a traceback's last line says was not found, or None for any other line."""
    match = _MISSING.match(line) if line.startswith("ModuleNotFoundError") else None
    return match.group(1) if match else None


def explain(module: str, environment: Environment | None) -> str:
    """One sentence for a failed task's reason: the module, where it was looked for, what to do."""
    said = f"the program could not import {module!r}"
    if environment is None:
        return (
            f"{said}, which the agents' runtime does not have: list the package that provides it in a "
            "requirements.txt and submit with --requirements"
        )
    if environment.extends:
        return (
            f"{said}: neither the job's environment nor the agents' runtime it extends has it; add the "
            "package that provides it to the job's requirements"
        )
    return (
        f"{said}: the job's environment is isolated (--isolated-env, or a Python other than the agents'), "
        "so it holds only the job's requirements; add the package that provides it to them, or submit "
        "without --isolated-env to extend the agents' runtime (TensorFlow, tf-keras, numpy)"
    )

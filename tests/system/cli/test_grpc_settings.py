"""The `mwms` command gives gRPC mwms's settings (mwms/grpc_process.py) before gRPC loads: gRPC reads them
once, as it loads, so a setting given after that import would change nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from mwms import grpc_process

# Notes what the environment holds when `grpc` is first imported, then loads the command and, as its server
# and agent commands do, the coordinator and the agent.
WATCH = textwrap.dedent(
    """
    import importlib.abc, json, os, sys
    seen = {}
    class Watch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "grpc" and not seen:
                seen.update({n: os.environ.get(n) for n in NAMES})
            return None
    sys.meta_path.insert(0, Watch())
    import mwms.cli.main
    import mwms.server.app
    import mwms.worker_agent.main
    print(json.dumps(seen))
    """
)


def run_watch(environ: dict[str, str]) -> dict[str, str | None]:
    script = f"NAMES = {sorted(grpc_process.SETTINGS)!r}\n{WATCH}"
    done = subprocess.run(
        [sys.executable, "-c", script], env=environ, capture_output=True, text=True, timeout=120, check=True
    )
    seen: dict[str, str | None] = json.loads(done.stdout.splitlines()[-1])
    return seen


def clean_environment() -> dict[str, str]:
    return {
        name: value
        for name, value in os.environ.items()
        if name not in grpc_process.SETTINGS and name != grpc_process.MARK
    }


def test_grpc_loads_with_mwmss_settings() -> None:
    assert run_watch(clean_environment()) == grpc_process.SETTINGS


def test_grpc_loads_with_the_operators_own_value() -> None:
    environ = clean_environment() | {"GRPC_EXPERIMENTS": "-event_engine_dns"}
    assert run_watch(environ)["GRPC_EXPERIMENTS"] == "-event_engine_dns"

"""`mwms doctor --agents A,B`: the gang's preflight check on chosen agents, as a job of its own, as a table.

The job pins worker i to the i-th agent (JobCreate.agents), turns the preflight check on and asks it to
stream MWMS_PREFLIGHT_TCP_MB over a plain TCP socket from each worker to the next first, so the table sets
TensorFlow's all-reduce bandwidth beside the raw link's. Progress goes to stderr; the table (or --json) to
stdout. Exit 0 when every worker passed, 1 when a check failed, 2 on bad usage or a doctor job that did not
end in time (it is cancelled).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

import mwms.doctor_bundle
from mwms.cli.connect import with_client
from mwms.cli.durations import DURATION_METAVAR, duration_option_parser
from mwms.cli.errors import CliError, ExitCode
from mwms.cli.options import JsonOption
from mwms.cli.output import cells, err, first_line, out, print_json
from mwms.cli.safe_text import safe_text, terminal_safe
from mwms.cli.submit import pack_and_upload
from mwms.client import Client, Preflight
from mwms.preflight_contract import TCP_MB_ENV, size_label

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
POLL_SECONDS = 0.5


def bundle_dir() -> Path:
    """The directory packed as the doctor job's bundle (inside the installed mwms package)."""
    return Path(mwms.doctor_bundle.__file__).parent


def parse_agents(text: str) -> list[str]:
    """'a, b,c' -> ['a', 'b', 'c']; at least two, since a check needs a gang."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if len(names) < 2:
        raise CliError("--agents needs at least two agent names or ids, e.g. --agents gpu-1,gpu-2")
    return names


def doctor_spec(digest: str, agents: list[str], tcp_mb: int) -> dict[str, Any]:
    """The doctor job: worker i on agents[i], preflight on, no restarts."""
    return {
        "name": "mwms-doctor " + ",".join(agents),
        "bundle_digest": digest,
        "command": ["python", "doctor_done.py"],
        "workers": len(agents),
        "agents": agents,
        "preflight": True,
        "env": {TCP_MB_ENV: str(tcp_mb)},
        "restart": {"max_restarts": 0},
    }


def wait_for_end(client: Client, job_id: str, timeout_s: float) -> dict[str, Any]:
    """Polls the job until it ends, telling state changes (and why it waits) on stderr."""
    deadline = time.monotonic() + timeout_s
    said = ""
    while True:
        job = client.job(job_id).raw
        line = terminal_safe(f"{job['state']}: {first_line(job.get('reason'))}")
        if line != said:
            err.print(safe_text(f"doctor job {job_id}: {line}"))
            said = line
        if job["state"] in TERMINAL:
            return job
        if time.monotonic() > deadline:
            client.cancel(job_id)
            raise CliError(
                f"the doctor job {job_id} did not end within {timeout_s:g} s and was cancelled; last state "
                f"{line}",
                ExitCode.USAGE,
            )
        time.sleep(POLL_SECONDS)


def worker_rows(job: dict[str, Any], preflight: Preflight) -> list[dict[str, Any]]:
    """One row per worker of the last attempt: its agent, whether it passed, and what it measured."""
    tasks = {t["index"]: t for t in job.get("tasks") or []}  # the newest attempt's
    by_index = {r["task_index"]: r for r in preflight.latest_results}
    rows = []
    for index in sorted(tasks):
        task, result = tasks[index], by_index.get(index)
        report = (result or {}).get("report") or {}
        rows.append(
            {
                "worker": index,
                "agent": task["agent_name"],
                "address": task["address"],
                "ok": bool(result and result["ok"]),
                "message": (result or {}).get("message")
                or ("" if result else first_line(task.get("message")) or "no result reported"),
                "peers_reachable": [p["worker"] for p in report.get("peers", [])],
                "tcp": report.get("tcp"),
                "allreduce": report.get("allreduce", []),
                "collective": report.get("collective", ""),
            }
        )
    return rows


def _gbps(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def doctor_table(rows: list[dict[str, Any]]) -> Table:
    sizes = sorted({a["bytes"] for row in rows for a in row["allreduce"]})
    table = Table(box=None, header_style="bold")
    for column in ("WORKER", "AGENT", "ADDRESS", "REACHES", "TCP→NEXT GB/s"):
        table.add_column(column)
    for size in sizes:
        table.add_column(f"{size_label(size)} ALGBW")
        table.add_column(f"{size_label(size)} BUSBW")
    table.add_column("RESULT")
    for row in rows:
        by_size = {a["bytes"]: a for a in row["allreduce"]}
        tcp = row["tcp"]
        values: list[object] = [
            row["worker"],
            row["agent"],
            row["address"],
            ",".join(str(p) for p in row["peers_reachable"]) or "-",
            f"{_gbps(tcp['gbps'])} (→{tcp['to_worker']})" if tcp else "-",
        ]
        for size in sizes:
            found = by_size.get(size)
            values += [_gbps(found and found["algbw_gbps"]), _gbps(found and found["busbw_gbps"])]
        values.append("ok" if row["ok"] else f"FAILED: {row['message']}")
        table.add_row(*cells(*values))
    return table


@with_client
def doctor(
    client: Client,
    agents: Annotated[
        str,
        typer.Option("--agents", help="Comma-separated names (or ids) of the agents to check, at least two."),
    ],
    tcp_mb: Annotated[
        int,
        typer.Option(help="MB each worker streams to the next over plain TCP (0: no raw bandwidth).", min=0),
    ] = 64,
    timeout: Annotated[
        float,
        typer.Option(
            parser=duration_option_parser(),
            metavar=DURATION_METAVAR,
            help="How long to wait for the doctor job, e.g. 5m (it waits while agents are busy).",
        ),
    ] = 300.0,
    json_output: JsonOption = False,
) -> None:
    """Check that the agents reach each other and measure all-reduce and raw TCP bandwidth between them."""
    names = parse_agents(agents)
    if tcp_mb > 4096:
        raise CliError("--tcp-mb is at most 4096")
    digest = pack_and_upload(client, bundle_dir(), quiet=True)
    job = client.create_job(doctor_spec(digest, names, tcp_mb)).raw
    err.print(safe_text(f"doctor job {job['id']}: checking {', '.join(names)}"))
    job = wait_for_end(client, job["id"], timeout)
    preflight = client.preflight(job["id"])
    rows = worker_rows(job, preflight)
    ok = job["state"] == "SUCCEEDED" and bool(rows) and all(row["ok"] for row in rows)
    if json_output:
        print_json({"job_id": job["id"], "state": job["state"], "ok": ok, "workers": rows})
    else:
        out.print(doctor_table(rows))
        collective = next((row["collective"] for row in rows if row["collective"]), "")
        out.print(
            safe_text(
                f"busbw = algbw × 2(n−1)/n; collective {collective or 'unknown'}; job {job['id']} {job['state']}"
            )
        )
        if not ok:
            err.print(f"the check failed: {first_line(job.get('reason'))}")
    if not ok:
        raise typer.Exit(int(ExitCode.JOB_NOT_SUCCEEDED))

"""Jobs for people: the jobs table, one job's summary with its tasks and events, its metrics and artifacts
(re-exported by mwms/cli/output.py)."""

from __future__ import annotations

import math
from typing import Any

from rich.table import Table
from rich.text import Text

from mwms.cli.formatting import (
    cells,
    first_line,
    format_devices,
    format_duration,
    format_loss,
    format_resources,
    format_time,
    job_duration,
    metric_value,
    out,
    state_text,
    task_memory,
)
from mwms.cli.safe_text import safe_text
from mwms.environment_lock import distinct_count


def jobs_table(jobs: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    columns = ("ID", "NAME", "SUBMITTED BY", "TEAM", "PRIO", "STATE", "WORKERS", "STEP", "LOSS", "CREATED")
    for column in (*columns, "DURATION", "ATTEMPTS"):
        table.add_column(column, no_wrap=column in {"ID", "STATE", "CREATED"})
    for job in jobs:
        table.add_row(
            *cells(
                job["id"],
                job.get("name", ""),
                job.get("submitted_by") or "-",
                job.get("team") or "-",
                job.get("priority", "-"),
                state_text(job.get("state")),
                format_devices(job),
                "-" if job.get("step") is None else job["step"],
                format_loss(job.get("loss")),
                format_time(job.get("created_at")),
                format_duration(job_duration(job)),
                job.get("attempts", "-"),
            )
        )
    return table


def tasks_table(tasks: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    columns = (
        "TASK",
        "STATE",
        "AGENT",
        "ADDRESS",
        "DEVICES",
        "MEMORY",
        "EXIT",
        "STARTED",
        "ENDED",
        "MESSAGE",
    )
    for column in columns:
        table.add_column(column)
    for task in sorted(tasks, key=lambda item: item.get("index", 0)):
        indices = task.get("device_indices") or []
        devices = f"{task.get('device_kind', '')}:{','.join(map(str, indices))}" if indices else "-"
        table.add_row(
            *cells(
                task.get("index"),
                state_text(task.get("state")),
                task.get("agent_name") or task.get("agent_id") or "-",
                task.get("address") or "-",
                devices,
                task_memory(task),
                "-" if task.get("exit_code") is None else task["exit_code"],
                format_time(task.get("started_at")),
                format_time(task.get("ended_at")),
                task.get("message") or "",
            )
        )
    return table


def environment_rows(job: dict[str, Any]) -> list[tuple[str, str]]:
    """The job's own Python environment: its file and Python, where each task's stands, every package."""
    environment = job.get("environment")
    if not environment:
        return [("python env", "the agents' own")]
    python = environment.get("python") or "the agents' version"
    packages = environment.get("packages") or []
    rows = [
        (
            "python env",
            f"{environment.get('requirements') or '-'} (Python {python}, {distinct_count(packages)} packages, "
            + ("isolated)" if environment.get("isolated") else "over the agents' runtime)"),
        )
    ]
    built = [
        f"worker {task['index']} {task['environment']}"
        + (f" ({task['environment_build_seconds']:.1f} s)" if task.get("environment_build_seconds") else "")
        + (" (cached)" if task.get("environment_build_seconds") == 0 else "")
        for task in job.get("tasks") or []
        if task.get("environment")
    ]
    if built:
        rows.append(("env build", ", ".join(built)))
    rows.append(("packages", ("\n" + " " * 16).join(packages) or "-"))
    return rows


def print_job(job: dict[str, Any]) -> None:
    """A readable summary of one job: fields, newest attempt's tasks, then its events."""
    state = state_text(job.get("state"))
    header = Text.assemble(safe_text(job.get("name", ""), "bold"), safe_text(f"  {job['id']}  "), state)
    out.print(header)
    communication = job.get("communication") or {}
    restart = job.get("restart") or {}
    rows = [
        ("reason", (job.get("reason") or "-").replace("\n", "\n" + " " * 16)),
        ("submitted by", job.get("submitted_by") or "-"),
        ("team", job.get("team") or "-"),
        (
            "priority",
            f"{job.get('priority', '-')}"
            + ("" if job.get("preemptible", True) else ", not preemptible")
            + (
                f", {job['preemption_grace_seconds']} s grace when preempted"
                if job.get("preemption_grace_seconds") is not None
                else ""
            ),
        ),
        ("command", " ".join(job.get("command") or [])),
        ("workers", format_devices(job)),
        ("resources", format_resources(job)),
        ("created", format_time(job.get("created_at"))),
        ("started", format_time(job.get("started_at"))),
        ("finished", format_time(job.get("finished_at"))),
        ("duration", format_duration(job_duration(job))),
        ("attempts", f"{job.get('attempts', '-')} ({job.get('restarts', 0)} restarts)"),
        (
            "step/loss",
            f"{job.get('step') if job.get('step') is not None else '-'} / {format_loss(job.get('loss'))}",
        ),
        ("bundle", (job.get("bundle_digest") or "-")[:16]),
        ("env", ", ".join(job.get("env_names") or []) or "-"),
        (
            "collectives",
            ", ".join(f"{key}={value}" for key, value in communication.items() if value is not None)
            or "default",
        ),
        ("restart", ", ".join(f"{key}={value}" for key, value in restart.items()) or "default"),
    ]
    if job.get("cancelled_by"):
        rows.insert(2, ("cancelled by", job["cancelled_by"]))
    waiting = job.get("waiting") or {}
    if waiting:
        estimate = waiting.get("estimated_start")
        rows.insert(1, ("waiting", f"{waiting.get('kind', '?')}: {first_line(waiting.get('message'))}"))
        rows.insert(2, ("est. start", format_time(estimate) if estimate else "unknown"))
    if job.get("startup_timeout_seconds") is not None:
        rows.append(("startup", f"timeout {job['startup_timeout_seconds']}s"))
    if job.get("max_runtime_seconds") is not None:
        rows.append(("max runtime", f"{job['max_runtime_seconds']}s"))
    rows.extend(environment_rows(job))
    for label, value in rows:
        out.print(safe_text(f"  {label + ':':<14}{value}"))
    tasks = job.get("tasks") or []
    if tasks:
        out.print()
        out.print(Text("Tasks (newest attempt)", style="bold"))
        out.print(tasks_table(tasks))
    events = job.get("events") or []
    if events:
        out.print()
        out.print(Text("Events", style="bold"))
        table = Table(box=None, header_style="bold")
        for column in ("AT", "FROM", "TO", "REASON"):
            table.add_column(column)
        for event in events:
            table.add_row(
                *cells(
                    format_time(event.get("at")),
                    state_text(event.get("from_state")),
                    state_text(event.get("to_state")),
                    event.get("reason") or "",
                )
            )
        out.print(table)


def metrics_table(points: list[dict[str, Any]], index_label: str = "STEP") -> Table:
    """One row per step (per epoch: `index_label` "EPOCH"), one column per metric name (the newest
    attempt's value wins on a tie)."""
    names = sorted({point["name"] for point in points})
    by_step: dict[int, dict[str, float]] = {}
    for point in sorted(points, key=lambda item: (item["step"], item.get("attempt", 0))):
        by_step.setdefault(point["step"], {})[point["name"]] = metric_value(point)
    table = Table(box=None, header_style="bold")
    table.add_column(index_label, justify="right")
    for name in names:
        table.add_column(safe_text(name.upper()), justify="right")
    for step in sorted(by_step):
        values = by_step[step]
        table.add_row(*cells(step, *(f"{values[name]:.6g}" if name in values else "-" for name in names)))
    return table


def metrics_summary_table(points: list[dict[str, Any]]) -> Table:
    """Per metric: first and last value (with their steps), minimum, and how many points."""
    table = Table(box=None, header_style="bold")
    for column in ("METRIC", "FIRST", "LAST", "MIN", "POINTS"):
        table.add_column(column, justify="left" if column == "METRIC" else "right")
    series: dict[str, list[dict[str, Any]]] = {}
    for point in points:
        series.setdefault(point["name"], []).append(point)
    for name in sorted(series):
        ordered = sorted(series[name], key=lambda item: (item.get("attempt", 0), item["step"]))
        first, last = ordered[0], ordered[-1]
        finite = [value for value in map(metric_value, ordered) if not math.isnan(value)]
        table.add_row(
            *cells(
                name,
                f"{metric_value(first):.6g} @{first['step']}",
                f"{metric_value(last):.6g} @{last['step']}",
                f"{min(finite):.6g}" if finite else "nan",
                len(ordered),
            )
        )
    return table


def artifacts_table(artifacts: list[dict[str, Any]]) -> Table:
    from mwms.client.packing import human_size

    table = Table(box=None, header_style="bold")
    for column in ("PATH", "SIZE", "ATTEMPT", "CREATED", "SHA256"):
        table.add_column(column)
    for artifact in artifacts:
        table.add_row(
            *cells(
                artifact["path"],
                human_size(artifact.get("size", 0)),
                artifact.get("attempt", "-"),
                format_time(artifact.get("created_at")),
                (artifact.get("sha256") or "")[:12],
            )
        )
    return table

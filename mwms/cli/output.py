"""Rendering of API objects: JSON for scripts, rich tables and summaries for people."""

from __future__ import annotations

import json
import math
import os
import sys
from datetime import datetime, timezone
from typing import Any

from rich.table import Table
from rich.text import Text

from mwms.cli.safe_text import SafeConsole, safe_text, terminal_safe
from mwms.client.models import parse_number
from mwms.environment_lock import distinct_count
from mwms.metrics_line import parse_value
from mwms.sizes import format_size

# stdout carries results (tables, JSON, job ids, log text); stderr carries progress and errors.
# Piped output is not cut to 80 columns: scripts and files want whole rows.
# Both print no markup and no control sequences from the text they are given (mwms.cli.safe_text); values
# from the API still go through safe_text / terminal_safe here, so a sequence is removed whole.
_PIPED_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 200
out = SafeConsole(highlight=False, soft_wrap=True, width=_PIPED_WIDTH)
err = SafeConsole(stderr=True, highlight=False, soft_wrap=True)

# Carriage return, then erase to the end of the line: takes a live status line off the screen.
CLEAR_LINE = "\r\x1b[K"


def clear_status_line(stream: Any) -> bool:
    """Erases the line the cursor is on when `stream` is a terminal, so that what another stream prints
    next (the program's output on stdout) starts at column 0 instead of after a status line; writes
    nothing to a pipe or file. Says whether it cleared."""
    isatty = getattr(stream, "isatty", None)
    if isatty is None or not isatty():
        return False
    stream.write(CLEAR_LINE)
    stream.flush()
    return True


STATE_STYLES = {
    "PENDING": "yellow",
    "SCHEDULED": "cyan",
    "ASSIGNED": "cyan",
    "STARTING": "cyan",
    "RUNNING": "blue",
    "ACTIVE": "blue",
    "RESTARTING": "magenta",
    "PREEMPTING": "magenta",
    "PREEMPTED": "magenta",
    "SUCCEEDED": "green",
    "FAILED": "red",
    "REJECTED": "red",
    "LOST": "red",
    "CANCELLED": "bright_black",
    "STOPPED": "bright_black",
    "REPLACED": "bright_black",
}


def print_json(value: Any) -> None:
    """Writes `value` as JSON to stdout, and nothing else."""
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def state_text(state: str | None) -> Text:
    state = state or "-"
    return safe_text(state, style=STATE_STYLES.get(state, ""))


def cells(*values: object) -> list[Text]:
    """Table cells: Text as given (already safe), anything else as `safe_text` (None as "")."""
    return [value if isinstance(value, Text) else safe_text(value) for value in values]


def parse_time(value: str | None) -> datetime | None:
    """An API timestamp as an aware datetime (naive ones are UTC)."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def format_time(value: str | None) -> str:
    """'2026-01-02T03:04:05Z' -> '2026-01-02 03:04:05' in local time."""
    moment = parse_time(value)
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


def format_duration(seconds: float | None) -> str:
    """75 -> '1m15s'."""
    if seconds is None:
        return "-"
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def job_duration(job: dict[str, Any], now: datetime | None = None) -> float | None:
    """Seconds from start to finish (or to now while it runs)."""
    started = parse_time(job.get("started_at"))
    if started is None:
        return None
    finished = parse_time(job.get("finished_at")) or now or datetime.now(timezone.utc)
    return (finished - started).total_seconds()


def first_line(text: str | None) -> str:
    """The first line of a possibly multi-line reason, made `terminal_safe`, marked when more follows."""
    lines = terminal_safe(text).strip().splitlines()
    if not lines:
        return ""
    return lines[0] + (" …" if len(lines) > 1 else "")


def format_loss(loss: float | str | None) -> str:
    """A job's loss: a number, "nan", "inf" or "-inf" ("NaN"/"Infinity" from the API), "-" when unknown."""
    value = parse_number(loss)
    return "-" if value is None else f"{value:.4g}"


def metric_value(point: dict[str, Any]) -> float:
    """A metric point's value as a float; NaN and ±inf come as "NaN"/"Infinity"/"-Infinity" (or null)."""
    return parse_value(point.get("value"))


def format_devices(job: dict[str, Any]) -> str:
    gpus = job.get("gpus_per_worker") or 0
    return f"{job.get('workers', '?')}×{gpus} GPU" if gpus else f"{job.get('workers', '?')}×CPU"


def format_resources(job: dict[str, Any]) -> str:
    """'8 GiB memory, 4 CPUs per worker' (as submitted); 'the agents' defaults' when neither was asked."""
    memory = job.get("memory_per_worker")
    cpus = job.get("cpus_per_worker")
    parts = [f"{format_size(memory)} memory"] if memory else []
    if cpus:
        parts.append(f"{cpus:g} CPU{'' if cpus == 1 else 's'}")
    return f"{', '.join(parts)} per worker" if parts else "the agents' defaults"


def task_memory(task: dict[str, Any]) -> str:
    """A task's peak memory and its limit: 'peak 1.2 GiB of 8 GiB', 'limit 8 GiB', '-' when unreported."""
    peak, limit = task.get("peak_memory_bytes"), task.get("memory_limit_bytes")
    if peak:
        return f"peak {format_size(peak)}" + (f" of {format_size(limit)}" if limit else "")
    return f"limit {format_size(limit)}" if limit else "-"


def agent_memory(agent: dict[str, Any]) -> str:
    memory = agent.get("memory_bytes")
    return format_size(memory) if memory else "-"


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


def isolation_cell(label: str) -> Text:
    """The agent's task isolation; one whose tasks share the agent's user stands out."""
    if not label:
        return Text("-")
    return safe_text(label, style="yellow" if "share" in label or "no sandbox" in label else "")


def cordon_text(agent: dict[str, Any]) -> Text:
    """schedulable, cordoned, draining or drained, with who did it and why."""
    if not agent.get("cordoned"):
        return Text("schedulable", style="green")
    label = "drained" if agent.get("drained") else "draining" if agent.get("draining") else "cordoned"
    who = f" by {agent.get('cordoned_by')}" if agent.get("cordoned_by") else ""
    why = f": {first_line(agent.get('cordon_reason'))}" if agent.get("cordon_reason") else ""
    return Text.assemble(safe_text(label, "yellow"), safe_text(f"{who}{why}"))


def agents_table(agents: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    columns = (
        "NAME",
        "ID",
        "ADDRESS",
        "STATUS",
        "CORDON",
        "DEVICES",
        "USED",
        "FREE",
        "MEMORY",
        "TASKS",
        "ISOLATION",
        "HEARTBEAT",
    )
    for column in columns:
        table.add_column(column)
    for agent in agents:
        devices = agent.get("devices", [])
        kinds: dict[str, int] = {}
        for device in devices:
            kinds[device.get("kind", "?")] = kinds.get(device.get("kind", "?"), 0) + 1
        tasks = ", ".join(
            f"{task.get('job_name') or task.get('job_id')}[{task.get('task_index')}]"
            for task in agent.get("tasks", [])
        )
        table.add_row(
            *cells(
                agent.get("name", ""),
                agent.get("id", ""),
                agent.get("address", ""),
                agent_status_text(agent),
                cordon_text(agent) if agent.get("cordoned") else "-",
                ", ".join(f"{count}×{kind}" for kind, count in kinds.items()) or "-",
                agent.get("devices_used", "-"),
                agent.get("devices_free", "-"),
                agent_memory(agent),
                tasks or "-",
                isolation_cell(agent.get("task_isolation", "")),
                format_time(agent.get("last_heartbeat_at")),
            )
        )
    return table


# An agent's state (AgentOut.state) as the agents table shows it; an older coordinator sends only `online`.
AGENT_STATE_STYLES = {"online": "green", "stopped": "dim", "lost": "red", "removed": "dim"}


def agent_status_text(agent: dict[str, Any]) -> Text:
    """online, stopped (a clean stop), lost or removed."""
    state = agent.get("state") or ("online" if agent.get("online") else "lost")
    return safe_text(state, style=AGENT_STATE_STYLES.get(state, ""))


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


def log_line_text(line: dict[str, Any], *, prefix: bool) -> Text:
    """`[task I] text` (or the bare text), stderr lines dimmed, made `terminal_safe`."""
    style = "dim" if line.get("stream") == "stderr" else ""
    text = safe_text(str(line.get("text", "")).rstrip("\n"), style=style)
    if prefix:
        return Text.assemble(safe_text(f"[task {line.get('task')}] ", "cyan"), text)
    return text


def raw_log_line(line: dict[str, Any], *, prefix: bool) -> bytes:
    """A log line's text exactly as stored (escape sequences included), for `mwms logs --raw`: a plain
    `[task I] ` prefix when asked for, and a newline unless it ends in one."""
    text = str(line.get("text", ""))
    head = f"[task {line.get('task')}] " if prefix else ""
    return (head + text + ("" if text.endswith("\n") else "\n")).encode("utf-8", "surrogatepass")


def write_raw(data: bytes) -> None:
    """Writes `data` to stdout unchanged, past rich (`mwms logs --raw`)."""
    sys.stdout.flush()
    stream = getattr(sys.stdout, "buffer", None)
    if stream is None:  # a text-only stdout (some embedders): the same characters
        sys.stdout.write(data.decode("utf-8", "surrogatepass"))
        sys.stdout.flush()
        return
    stream.write(data)
    stream.flush()

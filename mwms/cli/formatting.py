"""The CLI's consoles and the formatting of single values: states, times, durations, losses, resources,
log lines; JSON for scripts (re-exported by mwms/cli/output.py)."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timezone
from typing import Any

from rich.text import Text

from mwms.cli.safe_text import SafeConsole, safe_text, terminal_safe
from mwms.client.models import parse_number
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


def state_change_detail(job: dict[str, Any], previous_state: str | None) -> str:
    """What follows "job <state>" when a follower sees the state change: the first line of the reason, or
    for RUNNING, where the workers run when SCHEDULED (whose reason names them) went by between two polls
    ("" when there is nothing to add)."""
    state = job.get("state")
    if state != "RUNNING":
        return first_line(job.get("reason"))
    if previous_state == "SCHEDULED":
        return ""  # its line named the workers' addresses already
    tasks = job.get("tasks") or []
    newest = max((task.get("attempt") or 0 for task in tasks), default=0)
    addresses = [task.get("address") or "?" for task in tasks if (task.get("attempt") or 0) == newest]
    if not addresses:
        return ""
    workers = "1 worker" if len(addresses) == 1 else f"{len(addresses)} workers"
    return terminal_safe(f"{workers} on {', '.join(addresses)}")


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

"""Each attempt's story in `mwms status`: one line per attempt, why it ended and after how long.

The coordinator words the ending (attempt_history[].ended.message, the same sentence the dashboard shows);
a line adds the attempt's number and how long it lasted:
"attempt 2: preempted by job 3f2a9c1d0b4e (priority 900) after 4m02s". An attempt still going reads
"attempt 3: active for 1m10s". The API lists a job's newest attempts only; a line first says how many older
ones it left out. Text from the coordinator is made terminal-safe (agent names, drain reasons, notes).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from rich.text import Text

from mwms.cli.output import format_duration, out, parse_time
from mwms.cli.safe_text import safe_text


def lasted(attempt: dict[str, Any], now: datetime) -> float | None:
    """Seconds from the attempt's creation to its end (to `now` while it is active)."""
    created = parse_time(attempt.get("created_at"))
    if created is None:
        return None
    return ((parse_time(attempt.get("ended_at")) or now) - created).total_seconds()


def story_line(attempt: dict[str, Any], now: datetime) -> Text:
    """'attempt 2: preempted by job abc123 (priority 900) after 4m02s'."""
    duration = format_duration(lasted(attempt, now))
    ended = attempt.get("ended")
    if ended:
        told = f"{ended.get('message') or ended.get('kind') or 'ended'} after {duration}"
    elif attempt.get("ended_at"):  # an API from before endings: the reason's first line
        told = (
            f"{(attempt.get('reason') or attempt.get('state') or 'ended').splitlines()[0]} after {duration}"
        )
    else:
        told = f"active for {duration}"
    return Text.assemble(safe_text(f"attempt {attempt.get('number', '?')}", "bold"), ": ", safe_text(told))


def story_lines(job: dict[str, Any], now: datetime | None = None) -> list[Text]:
    """The lines of every attempt the job lists, oldest first, after a note of those it left out."""
    now = now or datetime.now(timezone.utc)
    history = job.get("attempt_history") or []
    lines = [story_line(attempt, now) for attempt in history]
    older = (history[0].get("number") or 1) - 1 if history else 0
    if older > 0:
        lines.insert(0, safe_text(f"({older} older attempts not listed; the job lists its newest)", "dim"))
    return lines


def print_attempt_stories(job: dict[str, Any]) -> None:
    """Prints the job's attempts' stories under a heading; nothing before its first attempt."""
    lines = story_lines(job)
    if not lines:
        return
    out.print()
    out.print(Text("Attempts", style="bold"))
    for line in lines:
        out.print(Text.assemble("  ", line))

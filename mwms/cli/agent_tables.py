"""The agents table of `mwms agents`: status, cordon, devices, tasks and isolation of each agent
(re-exported by mwms/cli/output.py)."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from mwms.cli.formatting import (
    agent_memory,
    cells,
    first_line,
    format_time,
)
from mwms.cli.safe_text import safe_text
from mwms.sizes import format_size


def isolation_cell(label: str) -> Text:
    """The agent's task isolation; one whose tasks share the agent's user stands out."""
    if not label:
        return Text("-")
    return safe_text(label, style="yellow" if "share" in label or "no sandbox" in label else "")


def warm_pool_cell(pool: dict[str, Any] | None) -> str:
    """Its warm interpreters: "ready/kept (memory)", e.g. "1/1 (540 MiB)"; "-" when it keeps none."""
    if not pool or not pool.get("size"):
        return "-"
    memory = pool.get("memory_bytes") or 0
    return f"{pool.get('ready', 0)}/{pool['size']}" + (f" ({format_size(memory)})" if memory else "")


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
        "WARM",
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
                warm_pool_cell(agent.get("warm_pool")),
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

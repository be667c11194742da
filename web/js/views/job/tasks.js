// The job page's Tasks panel: the shown attempt's workers, one row each (state, exit code, message, agent,
// run time, devices, peak memory, address, a button to their logs, and their TF_CONFIG behind a disclosure).

import { clampedText, emptyState, h, panel, replaceChildren, stateBadge, table } from "../../dom.js";
import { formatBytes, formatDuration, formatShortTime } from "../../format.js";
import { changeTracker } from "./changes.js";

/** What a task of the shown attempt reads, as {state, message}: the worker whose own failure ended the
 * attempt (`ended_attempt`) as FAILED (or LOST) with its own message; its peers that ended because of it as
 * STOPPED "because worker N failed", their own message after it (often a collective that lost its peer). */
export function taskOutcome(task, tasks) {
  const failed = tasks.find((t) => t.ended_attempt);
  if (!failed || !["FAILED", "STOPPED"].includes(task.state)) return { state: task.state, message: task.message || "" };
  if (task === failed) return { state: "FAILED", message: task.message || "" };
  const because = `stopped because worker ${failed.index} ${failed.state === "LOST" ? "was lost" : "failed"}`;
  const own = task.message && !task.message.startsWith("stopped because") ? ` (${task.message})` : "";
  return { state: "STOPPED", message: because + own };
}

// A task's peak memory as its agent measured it ("1.2 GiB"; the cell stays narrow), and on hover the
// limit the agent applied: "peak 1.2 GiB of its 8.0 GiB limit".
function taskMemory(task) {
  const peak = task.peak_memory_bytes;
  const limit = task.memory_limit_bytes;
  const shown = peak ? formatBytes(peak) : "–";
  const title = `peak ${peak ? formatBytes(peak) : "not reported"}${limit ? ` of its ${formatBytes(limit)} limit` : ""}`;
  return { shown, title };
}

function prettyTfConfig(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text || "";
  }
}

/** One task's row; its TF_CONFIG stays open if it was; onLogs(index) shows its logs. */
function taskRow(task, tasks, openConfigs, onLogs) {
  const outcome = taskOutcome(task, tasks);
  return h(
    "tr",
    { dataset: task.ended_attempt ? { taskIndex: String(task.index), endedAttempt: "true" } : { taskIndex: String(task.index) } },
    h("td", { class: "num" }, String(task.index)),
    h("td", { dataset: { testid: "task-state" } }, stateBadge(outcome.state)),
    h("td", { class: "num mono", dataset: { testid: "task-exit-code" } }, task.exit_code === null || task.exit_code === undefined ? "–" : String(task.exit_code)),
    h("td", { class: "cell-message", dataset: { testid: "task-message" } }, clampedText(outcome.message, { limit: 120 })),
    h("td", { class: "cell-agent", title: task.agent_name || task.agent_id || null }, task.agent_name || task.agent_id || "–"),
    h("td", { class: "nowrap" }, formatDuration(task.started_at, task.ended_at)),
    h("td", { class: "nowrap" }, formatShortTime(task.started_at)),
    h("td", null, task.device_kind ? `${task.device_kind}${task.device_indices.length ? ` ${task.device_indices.join(",")}` : ""}` : "–"),
    h("td", { class: "num nowrap", title: taskMemory(task).title, dataset: { testid: "task-peak-memory" } }, taskMemory(task).shown),
    h("td", { class: "mono" }, task.address || "–"),
    h("td", { class: "cell-actions" }, h("button", { type: "button", class: "button small ghost", onclick: () => onLogs(task.index) }, "Logs")),
    h(
      "td",
      { class: "cell-config" },
      h(
        "details",
        { class: "tf-config", dataset: { task: String(task.index) }, open: openConfigs.has(String(task.index)) },
        h("summary", null, "TF_CONFIG"),
        h("pre", { class: "code-block" }, prettyTfConfig(task.tf_config)),
      ),
    ),
  );
}

/** The panel: {element, refresh(job)}; a row's Logs button calls onLogs(task index). */
export function tasksPanel(onLogs) {
  const changed = changeTracker();
  const body = h("div");
  const attemptLabel = h("span", { class: "muted small" });
  const element = panel("Tasks", body, { id: "tasks", tools: attemptLabel });

  function refresh(job) {
    const newest = job.attempt_history.length ? job.attempt_history[job.attempt_history.length - 1].number : job.attempts;
    attemptLabel.textContent = job.tasks.length ? `attempt ${job.tasks[0].attempt ?? newest}` : "";
    if (!changed("tasks", job.tasks)) return;
    if (!job.tasks.length) {
      replaceChildren(body, emptyState("No tasks placed yet.", job.state === "PENDING" ? "The job waits until agents have enough free devices for all its workers at once." : null));
      return;
    }
    const openConfigs = new Set([...body.querySelectorAll("details[open]")].map((d) => d.dataset.task));
    const rows = job.tasks.map((task) => taskRow(task, job.tasks, openConfigs, onLogs));
    // The columns that say how each worker fares come first: at 800 px the rest scrolls inside the panel.
    const columns = ["#", "State", "Exit", "Message", "Agent", "Ran", "Started", "Devices", "Peak mem", "Address", "Logs", "Config"].map((label) => ({ label }));
    columns[0].class = "num";
    columns[2].class = "num";
    columns[8].class = "num";
    replaceChildren(body, table(columns, rows, { class: "tasks-table", attrs: { "data-testid": "tasks-table" } }));
  }

  return { element, refresh };
}

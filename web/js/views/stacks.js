// Stack dumps on the job page: a "Dump stacks" button (users and admins, while the job runs) and the newest
// dump with every task side by side: its agent, pid, whether it waits in a TensorFlow collective (over the
// dump's snapshots: "NOT in collective" only when outside one in all of them, with how many were taken), and
// each thread's stack (innermost frame first, of the snapshot the coordinator shows) behind a disclosure. Data: POST / GET /api/v1/jobs/{id}/stacks
// (server/api/stacks.py); hang detection's dumps show here too.

import { API, ApiError, describeError, getJson, postJson } from "../api.js";
import { emptyState, h, panel, replaceChildren } from "../dom.js";
import { formatTime } from "../format.js";
import { mayCancel } from "../session.js";

const LIVE_STATES = new Set(["SCHEDULED", "RUNNING"]);

function collectiveBadge(task) {
  if (task.in_collective === null || task.in_collective === undefined) {
    return h("span", { class: "badge stacks-unknown", dataset: { testid: "stacks-collective" } }, "no dump");
  }
  return task.in_collective
    ? h("span", { class: "badge stacks-in", dataset: { testid: "stacks-collective" } }, "in collective")
    : h("span", { class: "badge stacks-out", dataset: { testid: "stacks-collective" } }, "NOT in collective");
}

/** What the verdict rests on: "outside a collective in 3 of 3 snapshots", "in a collective in 1 of 3
 * snapshots"; null without a dump. A worker is NOT in a collective only when outside one in every snapshot. */
export function snapshotsText(task) {
  const taken = task.snapshots || 0;
  if (task.in_collective === null || task.in_collective === undefined || !taken) return null;
  const inside = task.snapshots_in_collective || 0;
  const plural = taken === 1 ? "snapshot" : "snapshots";
  return task.in_collective ? `in a collective in ${inside} of ${taken} ${plural}` : `outside a collective in ${taken - inside} of ${taken} ${plural}`;
}

function threadView(thread, open) {
  return h(
    "details",
    { class: "stacks-thread", open, dataset: { testid: "stacks-thread" } },
    h(
      "summary",
      null,
      h("span", { class: "mono" }, thread.title),
      thread.in_collective ? h("span", { class: "badge stacks-in small" }, "collective") : null,
      h("span", { class: "muted small" }, ` ${thread.frames.length} frame${thread.frames.length === 1 ? "" : "s"}`),
    ),
    h("pre", { class: "code-block stacks-frames" }, thread.frames.join("\n")),
  );
}

function taskColumn(task) {
  // The main thread (listed first by both tools) and the threads in a collective start open.
  const threads = task.threads.map((thread, i) => threadView(thread, i === 0 || thread.in_collective));
  return h(
    "article",
    { class: ["stacks-task", task.in_collective === false ? "stacks-task-out" : null], dataset: { testid: "stacks-task", taskIndex: String(task.task_index) } },
    h("header", { class: "stacks-task-head" }, h("strong", null, `Worker ${task.task_index}`), collectiveBadge(task)),
    h(
      "p",
      { class: "muted small stacks-task-meta" },
      `agent ${task.agent_name || task.agent_id} · pid ${task.pid ?? "–"}${task.method ? ` · ${task.method}` : ""}`,
    ),
    snapshotsText(task) ? h("p", { class: "small stacks-snapshots", dataset: { testid: "stacks-snapshots" } }, snapshotsText(task)) : null,
    task.error ? h("p", { class: "stacks-error small" }, task.error) : null,
    threads,
  );
}

/** The job page's "Stacks" panel. */
export class JobStacks {
  constructor(jobId) {
    this.url = `${API}/jobs/${encodeURIComponent(jobId)}/stacks`;
    this.signature = null;
    this.taking = false;
    this.button = h("button", { type: "button", class: "button small", dataset: { testid: "dump-stacks" }, hidden: true }, "Dump stacks");
    this.button.addEventListener("click", () => this.take());
    this.note = h("p", { class: "inline-error", hidden: true, role: "status" });
    this.body = h("div", { dataset: { testid: "stacks-body" } }, emptyState("No stacks taken yet.", "Dump them while the job runs to see where every worker is: inside a collective, or stuck in its own code."));
    this.element = panel("Stacks", h("div", null, this.note, this.body), { id: "stacks", tools: this.button, className: "stacks-panel" });
  }

  dispose() {}

  /** Called on every poll of the job: shows the button when the caller may take stacks now, and fetches
   * the newest dump when the job names a new one (`latest_stacks`: a user or hang detection took it); a
   * job with none is not asked for any, so the page makes no request that answers 404. Never throws. */
  async update(job) {
    const live = LIVE_STATES.has(job.state);
    // Taking stacks pauses the job's tasks: owners and admins only, like cancelling.
    this.button.hidden = !mayCancel(job) || !live;
    this.button.disabled = this.taking || !live;
    const latest = job.latest_stacks || null;
    if (!latest || latest === this.signature) return;
    this.signature = latest;
    try {
      this.render(await getJson(`${this.url}?request=${encodeURIComponent(latest)}`));
    } catch (err) {
      // Pruned between the job's read and this one (the newest 20 are kept): the next poll names another.
      if (!(err instanceof ApiError && err.status === 404)) this.fail(`Could not load stacks: ${describeError(err)}`);
    }
  }

  async take() {
    this.taking = true;
    this.button.disabled = true;
    this.button.textContent = "Taking stacks…";
    try {
      const dump = await postJson(this.url, {});
      this.signature = dump.id; // the job's next read names it: no need to fetch it again
      this.render(dump);
    } catch (err) {
      this.fail(`Could not take stacks: ${describeError(err)}`);
    }
    this.taking = false;
    this.button.disabled = false;
    this.button.textContent = "Dump stacks";
  }

  fail(message) {
    this.note.textContent = message;
    this.note.hidden = false;
  }

  render(dump) {
    this.note.hidden = true;
    const cause = dump.cause === "hang" ? "taken by hang detection" : `taken by ${dump.requested_by || "a user"}`;
    const outside = dump.tasks.filter((t) => t.in_collective === false).map((t) => `worker ${t.task_index}`);
    const taken = Math.max(0, ...dump.tasks.map((t) => t.snapshots || 0));
    const across = taken > 1 ? ` (outside one in all ${taken} snapshots)` : "";
    replaceChildren(
      this.body,
      h(
        "p",
        { class: "small stacks-summary", dataset: { testid: "stacks-summary" } },
        `Attempt ${dump.attempt}, ${formatTime(dump.requested_at)}, ${cause}.`,
        taken > 1 ? ` ${taken} snapshots of each worker, about half a second apart.` : "",
        dump.complete ? "" : " Some tasks did not answer.",
        outside.length ? h("strong", null, ` Not in a collective: ${outside.join(", ")}${across}.`) : "",
      ),
      h("div", { class: "stacks-grid" }, dump.tasks.map(taskColumn)),
    );
  }
}

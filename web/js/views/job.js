// One job: its state and history, tasks, live metric charts, logs, artifacts, spec, and a cancel button.

import { API, ApiError, artifactUrl, describeError, getJson, postJson, UnreachableError } from "../api.js";
import { MetricChart } from "../chart.js";
import { confirmAction } from "../confirm.js";
import { clampedText, emptyState, h, panel, replaceChildren, stateBadge, table } from "../dom.js";
import {
  formatBytes,
  formatDuration,
  formatInteger,
  formatNumber,
  formatSeconds,
  formatShape,
  formatShortTime,
  formatTime,
  isTerminal,
  isWaiting,
  shellJoin,
} from "../format.js";
import { LogViewer } from "../logs.js";
import { startPolling } from "../poll.js";
import { attemptStories } from "./attempts.js";
import { JobDevices } from "./devices.js";
import { JobStacks } from "./stacks.js";
import { JobPreflight } from "./preflight.js";
import { estimatedStart, priorityText, waitKindBadge } from "../waiting.js";
import { mayCancel } from "../session.js";

// After a job ends its workers may still be stopping (a cancelled TensorFlow job trains on until SIGKILL),
// and their last reports and the chief's uploads land after the final state change. Metrics and artifacts
// are refreshed on every poll until the job has settled (every task ended and the charts reached the
// step the job reports), then a few more times, then every tenth poll.
const POLLS_AFTER_SETTLED = 3;
const SLOW_POLL_EVERY = 10;
const TERMINAL_TASK_STATES = new Set(["SUCCEEDED", "FAILED", "STOPPED", "REJECTED", "LOST"]);

/** The highest step the charts hold of the newest attempt, per-step series only (what the job's `step`
 * counts: server/services/telemetry.py progress_columns); null with none. */
export function chartedStep(points) {
  return points.reduce((charted, point) => chartedAfter(charted, point), { attempt: 0, step: null }).step;
}

/** chartedStep's state after one more point: the newest attempt seen and its latest per-step step. */
function chartedAfter(charted, point) {
  if (point.name.startsWith("epoch_") || point.attempt < charted.attempt) return charted;
  if (point.attempt > charted.attempt || charted.step === null) return { attempt: point.attempt, step: point.step };
  return { attempt: charted.attempt, step: Math.max(charted.step, point.step) };
}

/** Orders a series' points by attempt, then step (pages come in storage order). */
function byAttemptAndStep(a, b) {
  return a.attempt - b.attempt || a.step - b.step;
}

/** Whether an ended job has nothing more to show: every task ended and the charts hold its last step. */
export function settled(job, charted) {
  if (!isTerminal(job.state)) return false;
  if ((job.tasks || []).some((task) => !TERMINAL_TASK_STATES.has(task.state))) return false;
  return job.step === null || job.step === undefined || (charted !== null && charted >= job.step);
}

/** The task's own environment on its agent, in a few words: "building", "built in 3.2 s", "from the cache". */
export function environmentStatus(task) {
  if (task.environment === "building") return "building";
  if (task.environment !== "ready") return "waiting";
  const seconds = task.environment_build_seconds;
  return seconds ? `built in ${seconds.toFixed(1)} s` : "from the cache";
}

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

const LOG_TAIL_MARK = "\nlast log lines:\n"; // how the coordinator appends the failing task's last lines

/** A failed job's failure, open on the page: which worker failed (its exit code), the reason, and the
 * failing worker's last log lines. */
export function failureView(job) {
  const text = String(job.reason || "");
  const at = text.indexOf(LOG_TAIL_MARK);
  const head = at < 0 ? text : text.slice(0, at);
  const tail = at < 0 ? "" : text.slice(at + LOG_TAIL_MARK.length);
  const failed = (job.tasks || []).find((task) => task.ended_attempt);
  let title = "The job failed";
  if (failed && failed.state === "LOST") title = `Worker ${failed.index} was lost (agent ${failed.agent_name || failed.agent_id})`;
  else if (failed) title = `Worker ${failed.index} failed${failed.exit_code === null || failed.exit_code === undefined ? "" : ` with exit code ${failed.exit_code}`}`;
  return [
    h("div", { class: "failure-title", dataset: { testid: "job-failure-title" } }, title),
    head ? h("div", { class: "failure-reason", dataset: { testid: "job-failure-reason" } }, head) : null,
    tail ? h("div", { class: "muted small" }, "Its last log lines:") : null,
    tail ? h("pre", { class: "code-block failure-log", dataset: { testid: "job-failure-log" } }, tail) : null,
  ];
}

/** The job's own Python environment (submit --requirements): its file, Python, where each worker's build
 * stands, and the resolved packages behind a disclosure; or the agents' own. */
export function pythonEnvironment(job) {
  const environment = job.environment;
  if (!environment) return h("span", { class: "muted", dataset: { testid: "python-environment" } }, "the agents' own");
  const packages = environment.packages || [];
  const builds = (job.tasks || []).map((task) => `worker ${task.index}: ${environmentStatus(task)}`);
  return h(
    "div",
    { dataset: { testid: "python-environment" } },
    h("div", null, h("code", { class: "mono" }, environment.requirements || "requirements"), ` · Python ${environment.python || "of the agents"} · ${new Set(packages.map((p) => p.split("==")[0].toLowerCase().replaceAll("_", "-"))).size} packages · ${environment.isolated ? "isolated" : "over the agents' runtime"}`),
    builds.length ? h("div", { class: "muted small", dataset: { testid: "python-environment-builds" } }, builds.join(" · ")) : null,
    h(
      "details",
      { class: "small" },
      h("summary", null, "Resolved packages"),
      h("ul", { class: "mono package-list", dataset: { testid: "python-environment-packages" } }, packages.map((name) => h("li", null, name))),
    ),
  );
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

function stat(label, valueNode, testid) {
  return h("div", { class: "kv" }, h("span", { class: "kv-label" }, label), h("span", { class: "kv-value", dataset: { testid } }, valueNode));
}

function definitionList(entries) {
  return h(
    "dl",
    { class: "deflist" },
    entries.map(([term, value]) => [h("dt", null, term), h("dd", null, value)]),
  );
}

function prettyTfConfig(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text || "";
  }
}

function orderMetricNames(names) {
  return [...names].sort((a, b) => (a === "loss" ? -1 : b === "loss" ? 1 : a.localeCompare(b)));
}

/** Shows the page of job jobId in container; returns a function that stops it. */
export function mountJob(container, jobId) {
  const base = `${API}/jobs/${encodeURIComponent(jobId)}`;
  const disposers = [];
  let job = null;
  let pollsSinceSettled = 0;
  let charted = null; // chartedStep() of the metrics read so far
  let chartedState = { attempt: 0, step: null };
  // The points read so far, by name, and the cursor after them: each poll reads only what is new.
  const metricPoints = new Map();
  let metricsCursor = 0;

  const title = h("h1", { class: "page-title job-title", dataset: { testid: "job-name" } }, "Loading…");
  const badgeSlot = h("span", { class: "job-state", dataset: { testid: "job-state" } });
  const reason = h("div", { class: "job-reason muted" });
  const idLine = h("p", { class: "job-id mono muted small" }, jobId);
  const cancelButton = h("button", { type: "button", class: "button danger", dataset: { testid: "cancel-job" }, hidden: true }, "Cancel job");
  let cancelling = false;
  const notice = h("p", { class: "inline-error", hidden: true, role: "status" });
  const loadError = h("p", { class: "inline-error", hidden: true, role: "status" });
  const stats = h("div", { class: "kv-strip" });
  // Why a waiting job waits and when it may start (its `waiting` reason); hidden once it is placed.
  const waitingBox = h("section", { class: "waiting-box", dataset: { testid: "job-waiting" }, hidden: true, "aria-label": "Why this job waits" });
  // A failed job's reason and its failing worker's last lines, open (not behind a disclosure).
  const failureBox = h("section", { class: "failure-box", dataset: { testid: "job-failure" }, hidden: true, "aria-label": "Why this job failed" });
  const chartsGrid = h("div", { class: "charts" });
  const charts = new Map();
  const devices = new JobDevices(jobId); // GPU utilisation and memory per task; hidden for CPU-only jobs
  const stacks = new JobStacks(jobId); // Dump stacks button and the newest dump, tasks side by side
  const preflight = new JobPreflight(jobId); // the gang's preflight check per attempt; hidden when none ran
  const tasksBody = h("div");
  const eventsBody = h("div");
  const attemptsBody = h("div");
  const specBody = h("div");
  const artifactsBody = h("div");
  const attemptLabel = h("span", { class: "muted small" });
  let logs = null;
  const logsBody = h("div");

  replaceChildren(
    container,
    h("nav", { class: "breadcrumb", "aria-label": "Breadcrumb" }, h("a", { href: "#/jobs" }, "Jobs"), h("span", { "aria-hidden": "true" }, " / "), h("span", { class: "mono" }, jobId)),
    h(
      "div",
      { class: "page-head job-head" },
      h("div", { class: "job-head-main" }, h("div", { class: "title-row" }, title, badgeSlot), idLine, reason),
      h("div", { class: "job-actions" }, cancelButton),
    ),
    notice,
    loadError,
    waitingBox,
    failureBox,
    stats,
    panel("Metrics", chartsGrid, { id: "metrics" }),
    devices.element,
    preflight.element,
    panel("Tasks", tasksBody, { id: "tasks", tools: attemptLabel }),
    stacks.element,
    panel("Logs", logsBody, { id: "logs" }),
    h("div", { class: "grid-2" }, panel("State history", eventsBody, { id: "history" }), panel("Attempts", attemptsBody, { id: "attempts" })),
    h("div", { class: "grid-2" }, panel("Spec", specBody, { id: "spec" }), panel("Artifacts", artifactsBody, { id: "artifacts" })),
  );
  replaceChildren(chartsGrid, h("p", { class: "muted" }, "Loading metrics…"));

  cancelButton.addEventListener("click", async () => {
    if (!job) return;
    const confirmed = await confirmAction({
      title: "Cancel this job?",
      message: `“${job.name}” will stop: every running task is sent SIGTERM, then SIGKILL after the grace period. This cannot be undone.`,
      confirmLabel: "Cancel job",
      cancelLabel: "Keep running",
    });
    if (!confirmed) return;
    cancelling = true;
    cancelButton.disabled = true;
    cancelButton.textContent = "Cancelling…";
    try {
      await postJson(`${base}/cancel`, {});
      notice.hidden = true;
    } catch (err) {
      notice.textContent = `Could not cancel: ${describeError(err)}`;
      notice.hidden = false;
    }
    cancelling = false;
    cancelButton.textContent = "Cancel job";
    await poller.now();
  });

  let renderedSignatures = {};
  function changed(key, value) {
    const signature = JSON.stringify(value);
    if (renderedSignatures[key] === signature) return false;
    renderedSignatures[key] = signature;
    return true;
  }

  function renderHeader() {
    title.textContent = job.name || job.id;
    document.title = `${job.name || job.id} · mwms`;
    if (changed("state", job.state)) replaceChildren(badgeSlot, stateBadge(job.state));
    const failed = job.state === "FAILED" && Boolean(job.reason);
    if (changed("reason", [job.reason, failed, job.tasks])) {
      replaceChildren(reason, failed ? null : clampedText(job.reason, { limit: 240 }));
      replaceChildren(failureBox, failed ? failureView(job) : null);
    }
    reason.hidden = !job.reason || failed;
    failureBox.hidden = !failed;
    // Viewers never see Cancel, users only on their own jobs; the coordinator enforces the same rule.
    const cancellable = !isTerminal(job.state) && mayCancel(job);
    cancelButton.disabled = cancelling || !cancellable;
    cancelButton.hidden = !cancellable;
    replaceChildren(
      stats,
      stat("Submitted by", job.submitted_by || "–", "job-submitted-by"),
      job.cancelled_by ? stat("Cancelled by", job.cancelled_by, "job-cancelled-by") : null,
      stat("Team", job.team || "–", "job-team"),
      stat("Priority", priorityText(job.priority), "job-priority"),
      stat("Preemptible", job.preemptible === false ? "no" : "yes", "job-preemptible"),
      stat("Workers × devices", formatShape(job.workers, job.gpus_per_worker), "job-shape"),
      stat("Step", job.step === null || job.step === undefined ? "–" : formatInteger(job.step), "job-step"),
      stat("Loss", formatNumber(job.loss), "job-loss"),
      stat("Created", formatShortTime(job.created_at), "job-created"),
      stat("Started", formatShortTime(job.started_at), "job-started"),
      stat("Duration", formatDuration(job.started_at, job.finished_at), "job-duration"),
      stat("Attempts", `${job.attempts} (${job.restarts} restart${job.restarts === 1 ? "" : "s"})`, "job-attempts"),
    );
  }

  function renderWaiting() {
    const waiting = job.waiting || {};
    const shown = isWaiting(job.state) && Boolean(waiting.kind || waiting.message);
    waitingBox.hidden = !shown;
    // Rendered every poll while shown: the estimated start is relative ("in 3m").
    if (!shown) {
      waitingBox.replaceChildren();
      return;
    }
    const open = waitingBox.querySelector("details[open]") !== null;
    replaceChildren(
      waitingBox,
      h("div", { class: "waiting-head" }, h("span", { class: "waiting-title" }, "Waiting"), waiting.kind ? waitKindBadge(waiting.kind) : null),
      waiting.message ? h("div", { class: "waiting-message", dataset: { testid: "job-waiting-message" } }, clampedText(waiting.message, { limit: 240 })) : null,
      h("div", { class: "waiting-start muted small" }, "Estimated start: ", h("span", { dataset: { testid: "job-estimated-start" } }, estimatedStart(waiting))),
    );
    if (open) waitingBox.querySelector("details")?.setAttribute("open", "");
  }

  function renderTasks() {
    const newest = job.attempt_history.length ? job.attempt_history[job.attempt_history.length - 1].number : job.attempts;
    attemptLabel.textContent = job.tasks.length ? `attempt ${job.tasks[0].attempt ?? newest}` : "";
    if (!changed("tasks", job.tasks)) return;
    if (!job.tasks.length) {
      replaceChildren(tasksBody, emptyState("No tasks placed yet.", job.state === "PENDING" ? "The job waits until agents have enough free devices for all its workers at once." : null));
      return;
    }
    const openConfigs = new Set([...tasksBody.querySelectorAll("details[open]")].map((d) => d.dataset.task));
    const rows = job.tasks.map((task) => {
      const outcome = taskOutcome(task, job.tasks);
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
        h(
          "td",
          { class: "cell-actions" },
          h("button", { type: "button", class: "button small ghost", onclick: () => { logs.selectTask(task.index); document.getElementById("logs").scrollIntoView({ behavior: "smooth" }); } }, "Logs"),
        ),
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
    });
    // The columns that say how each worker fares come first: at 800 px the rest scrolls inside the panel.
    const columns = ["#", "State", "Exit", "Message", "Agent", "Ran", "Started", "Devices", "Peak mem", "Address", "Logs", "Config"].map((label) => ({ label }));
    columns[0].class = "num";
    columns[2].class = "num";
    columns[8].class = "num";
    replaceChildren(tasksBody, table(columns, rows, { class: "tasks-table", attrs: { "data-testid": "tasks-table" } }));
  }

  function renderHistory() {
    if (changed("events", job.events)) {
      const items = [...job.events].reverse().map((event) =>
        h(
          "li",
          { class: "timeline-item" },
          h("div", { class: "timeline-head" }, event.from_state ? [stateBadge(event.from_state), h("span", { class: "arrow", "aria-label": "to" }, "→")] : null, stateBadge(event.to_state), h("time", { class: "muted small", datetime: event.at }, formatTime(event.at))),
          event.reason ? h("div", { class: "timeline-reason" }, clampedText(event.reason, { limit: 200 })) : null,
        ),
      );
      replaceChildren(eventsBody, items.length ? h("ol", { class: "timeline", dataset: { testid: "events" } }, items) : emptyState("No state changes recorded.", null));
    }
    if (changed("attempts", job.attempt_history)) {
      replaceChildren(attemptsBody, attemptStories(job) || emptyState("No attempts yet.", "An attempt starts when all workers are placed."));
    }
  }

  function renderSpec() {
    const envStates = (job.tasks || []).map((task) => [task.environment, task.environment_build_seconds]);
    if (!changed("spec", [job.command, job.bundle_digest, job.env_names, job.communication, job.restart, job.finished_at, job.environment, envStates])) return;
    const communication = job.communication || {};
    const restart = job.restart || {};
    replaceChildren(
      specBody,
      definitionList([
        ["Command", h("code", { class: "mono wrap" }, shellJoin(job.command))],
        ["Workers", formatShape(job.workers, job.gpus_per_worker)],
        ["Memory per worker", job.memory_per_worker ? formatBytes(job.memory_per_worker) : "the agent's share"],
        ["CPUs per worker", job.cpus_per_worker ? String(job.cpus_per_worker) : "no cap"],
        ["Bundle", h("code", { class: "mono wrap", title: job.bundle_digest }, `sha256:${job.bundle_digest}`)],
        ["Python environment", pythonEnvironment(job)],
        ["Environment", job.env_names && job.env_names.length ? h("span", { class: "tags" }, job.env_names.map((name) => h("code", { class: "tag" }, name))) : h("span", { class: "muted" }, "none")],
        [
          "Communication",
          `${communication.implementation || "default"}` +
            `${communication.timeout_seconds ? `, timeout ${formatSeconds(communication.timeout_seconds)}` : ""}` +
            `${communication.bytes_per_pack ? `, ${formatBytes(communication.bytes_per_pack)} per pack` : ""}`,
        ],
        ["Restarts", `up to ${restart.max_restarts ?? "–"} on ${restart.restart_on || "–"} failures`],
        ["Startup timeout", job.startup_timeout_seconds ? formatSeconds(job.startup_timeout_seconds) : "server default"],
        ["Max runtime", job.max_runtime_seconds ? formatSeconds(job.max_runtime_seconds) : "unlimited"],
        ["Preflight check", job.preflight == null ? "server default" : job.preflight ? "on" : "off"],
        ...(job.agents ? [["Pinned to", h("span", { class: "tags" }, job.agents.map((name, i) => h("code", { class: "tag", title: `worker ${i}` }, name)))]] : []),
        ["Created", formatTime(job.created_at)],
        ["Finished", formatTime(job.finished_at)],
      ]),
    );
  }

  /** Reads the points stored since the last read, page by page; returns the names that got new ones. */
  async function readNewMetrics() {
    const grown = new Set();
    let page = { more: true };
    while (page.more) {
      page = await getJson(`${base}/metrics?after=${metricsCursor}`);
      for (const point of page.points || []) {
        if (!metricPoints.has(point.name)) metricPoints.set(point.name, []);
        metricPoints.get(point.name).push(point);
        grown.add(point.name);
        chartedState = chartedAfter(chartedState, point);
      }
      metricsCursor = page.cursor ?? metricsCursor;
    }
    for (const name of grown) metricPoints.get(name).sort(byAttemptAndStep);
    charted = chartedState.step;
    return grown;
  }

  async function refreshMetrics() {
    const grown = await readNewMetrics();
    const byName = metricPoints;
    if (!byName.size) {
      if (!chartsGrid.querySelector(".empty")) {
        replaceChildren(
          chartsGrid,
          emptyState(
            isTerminal(job?.state) ? "This job reported no metrics." : "No metrics reported yet.",
            "Report them from the training program with mwms_runtime (report(step, {'loss': loss}) or its Keras callback); they are charted here as they arrive.",
          ),
        );
      }
      return;
    }
    chartsGrid.querySelector(".empty")?.remove();
    chartsGrid.querySelector("p.muted")?.remove();
    for (const name of orderMetricNames(byName.keys())) {
      let chart = charts.get(name);
      if (!chart) {
        chart = new MetricChart(name);
        charts.set(name, chart);
        chartsGrid.append(chart.element);
      }
      if (grown.has(name)) chart.update(byName.get(name));
    }
  }

  function renderArtifacts(artifacts) {
    if (!changed("artifacts", artifacts)) return;
    if (!artifacts.length) {
      replaceChildren(artifactsBody, emptyState("No artifacts.", "Files the program saves under mwms_runtime's artifact directory are uploaded when a task ends and listed here."));
      return;
    }
    const rows = artifacts.map((artifact) =>
      h(
        "tr",
        null,
        h("td", { class: "cell-path" }, h("a", { href: artifactUrl(jobId, artifact.path), download: artifact.path.split("/").pop(), class: "mono", title: artifact.path }, artifact.path)),
        h("td", { class: "num nowrap" }, formatBytes(artifact.size)),
        h("td", { class: "mono muted small", title: artifact.sha256 }, artifact.sha256.slice(0, 12)),
        h("td", { class: "num" }, String(artifact.attempt)),
        h("td", { class: "nowrap" }, formatShortTime(artifact.created_at)),
      ),
    );
    const columns = [{ label: "Path" }, { label: "Size", class: "num" }, { label: "sha256" }, { label: "Attempt", class: "num" }, { label: "Saved" }];
    replaceChildren(artifactsBody, table(columns, rows, { class: "artifacts-table", attrs: { "data-testid": "artifacts-table" } }));
  }

  async function refresh() {
    try {
      job = await getJson(base);
    } catch (err) {
      if (err instanceof ApiError && err.status === 404) {
        poller.stop();
        replaceChildren(
          container,
          emptyState(`Job ${jobId} does not exist.`, "It may have been deleted, or the link is wrong."),
          h("p", { class: "center" }, h("a", { href: "#/jobs", class: "button" }, "Back to jobs")),
        );
        return;
      }
      if (!(err instanceof UnreachableError)) {
        loadError.textContent = `${describeError(err)} Retrying every 2 s.`;
        loadError.hidden = false;
      }
      throw err;
    }
    loadError.hidden = true;
    if (!logs) {
      logs = new LogViewer(jobId, job.name);
      disposers.push(() => logs.dispose());
      replaceChildren(logsBody, logs.element);
    }
    logs.setTaskCount(job.workers);
    renderHeader();
    renderWaiting();
    renderTasks();
    renderHistory();
    renderSpec();
    stacks.update(job);

    pollsSinceSettled = settled(job, charted) ? pollsSinceSettled + 1 : 0;
    if (pollsSinceSettled <= POLLS_AFTER_SETTLED || pollsSinceSettled % SLOW_POLL_EVERY === 0) {
      const [metrics, artifacts] = await Promise.allSettled([refreshMetrics(), getJson(`${base}/artifacts`), devices.refresh(job), preflight.refresh(job)]);
      if (artifacts.status === "fulfilled") renderArtifacts(artifacts.value);
      const failure = [metrics, artifacts].find((r) => r.status === "rejected");
      if (failure) throw failure.reason;
    }
  }

  const poller = startPolling(refresh, { onError: () => {} });
  disposers.push(() => poller.stop());
  disposers.push(() => charts.forEach((chart) => chart.dispose()));
  disposers.push(() => devices.dispose());
  disposers.push(() => stacks.dispose());
  return () => disposers.forEach((dispose) => dispose());
}

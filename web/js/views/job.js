// One job: its state and history, tasks, live metric charts, logs, artifacts, spec, and a cancel button.
//
// The page's parts live in ./job/ (head and cancel, waiting box, metrics, tasks, logs, history, spec,
// artifacts, and when to stop reading metrics once the job settled); mountJob lays them out and polls.

import { API, ApiError, describeError, getJson, UnreachableError } from "../api.js";
import { emptyState, h, replaceChildren } from "../dom.js";
import { startPolling } from "../poll.js";
import { JobDevices } from "./devices.js";
import { JobStacks } from "./stacks.js";
import { JobPreflight } from "./preflight.js";
import { artifactsPanel } from "./job/artifacts.js";
import { jobHeader } from "./job/header.js";
import { historyPanels } from "./job/history.js";
import { logsPanel } from "./job/logs-panel.js";
import { metricsPanel } from "./job/metrics.js";
import { settleGate } from "./job/settle.js";
import { specPanel } from "./job/spec.js";
import { tasksPanel } from "./job/tasks.js";
import { waitingBox } from "./job/waiting-box.js";

export { failureView } from "./job/header.js";
export { chartedStep, settled } from "./job/settle.js";
export { environmentStatus, pythonEnvironment } from "./job/spec.js";
export { taskOutcome } from "./job/tasks.js";

/** The parts of job jobId's page; onCancelled runs after its Cancel button posted. */
function jobParts(jobId, base, onCancelled) {
  const logs = logsPanel(jobId);
  return {
    header: jobHeader(jobId, base, onCancelled),
    loadError: h("p", { class: "inline-error", hidden: true, role: "status" }),
    waiting: waitingBox(),
    metrics: metricsPanel(base),
    devices: new JobDevices(jobId), // GPU utilisation and memory per task; hidden for CPU-only jobs
    stacks: new JobStacks(jobId), // Dump stacks button and the newest dump, tasks side by side
    preflight: new JobPreflight(jobId), // the gang's preflight check per attempt; hidden when none ran
    tasks: tasksPanel((index) => logs.showTask(index)),
    logs,
    history: historyPanels(),
    spec: specPanel(),
    artifacts: artifactsPanel(jobId, base),
  };
}

/** Places the parts in container, top to bottom. */
function layOut(container, jobId, parts) {
  const { header } = parts;
  replaceChildren(
    container,
    h("nav", { class: "breadcrumb", "aria-label": "Breadcrumb" }, h("a", { href: "#/jobs" }, "Jobs"), h("span", { "aria-hidden": "true" }, " / "), h("span", { class: "mono" }, jobId)),
    header.head,
    header.notice,
    parts.loadError,
    parts.waiting.element,
    header.failureBox,
    header.stats,
    parts.metrics.element,
    parts.devices.element,
    parts.preflight.element,
    parts.tasks.element,
    parts.stacks.element,
    parts.logs.element,
    parts.history.element,
    h("div", { class: "grid-2" }, parts.spec.element, parts.artifacts.element),
  );
}

/** Reads the job; a missing job replaces the page (and stops the poller), other errors show and rethrow. */
async function readJob(container, jobId, base, loadError, poller) {
  try {
    return await getJson(base);
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) {
      poller().stop();
      replaceChildren(
        container,
        emptyState(`Job ${jobId} does not exist.`, "It may have been deleted, or the link is wrong."),
        h("p", { class: "center" }, h("a", { href: "#/jobs", class: "button" }, "Back to jobs")),
      );
      return null;
    }
    if (!(err instanceof UnreachableError)) {
      loadError.textContent = `${describeError(err)} Retrying every 2 s.`;
      loadError.hidden = false;
    }
    throw err;
  }
}

/** One poll of the page: the job and every part, then (while due, see ./job/settle.js) metrics, artifacts,
 * devices and preflight together; their first failure is rethrown after all have settled. */
function jobRefresher(container, jobId, base, parts, poller) {
  const gate = settleGate();
  return async function refresh() {
    const job = await readJob(container, jobId, base, parts.loadError, poller);
    if (!job) return;
    parts.loadError.hidden = true;
    parts.logs.refresh(job);
    for (const part of [parts.header, parts.waiting, parts.tasks, parts.history, parts.spec]) part.refresh(job);
    parts.stacks.update(job);

    if (gate.due(job, parts.metrics.charted())) {
      const [metrics, artifacts] = await Promise.allSettled([parts.metrics.refresh(job), parts.artifacts.read(), parts.devices.refresh(job), parts.preflight.refresh(job)]);
      if (artifacts.status === "fulfilled") parts.artifacts.render(artifacts.value);
      const failure = [metrics, artifacts].find((r) => r.status === "rejected");
      if (failure) throw failure.reason;
    }
  };
}

/** Shows the page of job jobId in container; returns a function that stops it. */
export function mountJob(container, jobId) {
  const base = `${API}/jobs/${encodeURIComponent(jobId)}`;
  let poller = null;
  const parts = jobParts(jobId, base, () => poller.now());
  layOut(container, jobId, parts);
  poller = startPolling(jobRefresher(container, jobId, base, parts, () => poller), { onError: () => {} });
  return () => {
    poller.stop();
    parts.metrics.dispose();
    parts.devices.dispose();
    parts.stacks.dispose();
    parts.logs.dispose();
  };
}

// The job page's head: the name, state badge, reason and id, the Cancel button with its notice, a failed
// job's failure box (which worker failed, why, and its last log lines), and the strip of key figures.

import { describeError, postJson } from "../../api.js";
import { confirmAction } from "../../confirm.js";
import { clampedText, h, replaceChildren, stateBadge } from "../../dom.js";
import { formatDuration, formatInteger, formatNumber, formatShape, formatShortTime, isTerminal } from "../../format.js";
import { mayCancel } from "../../session.js";
import { priorityText } from "../../waiting.js";
import { changeTracker } from "./changes.js";

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

function stat(label, valueNode, testid) {
  return h("div", { class: "kv" }, h("span", { class: "kv-label" }, label), h("span", { class: "kv-value", dataset: { testid } }, valueNode));
}

/** The key figures of the strip under the head, in order. */
function jobStats(job) {
  return [
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
  ];
}

/** The Cancel button: asks first, posts to `${base}/cancel`, shows a failure in notice, then onCancelled(). */
function cancelControl(base, currentJob, notice, onCancelled) {
  const button = h("button", { type: "button", class: "button danger", dataset: { testid: "cancel-job" }, hidden: true }, "Cancel job");
  const control = { button, cancelling: false };
  button.addEventListener("click", async () => {
    const job = currentJob();
    if (!job) return;
    const confirmed = await confirmAction({
      title: "Cancel this job?",
      message: `“${job.name}” will stop: every running task is sent SIGTERM, then SIGKILL after the grace period. This cannot be undone.`,
      confirmLabel: "Cancel job",
      cancelLabel: "Keep running",
    });
    if (!confirmed) return;
    control.cancelling = true;
    button.disabled = true;
    button.textContent = "Cancelling…";
    try {
      await postJson(`${base}/cancel`, {});
      notice.hidden = true;
    } catch (err) {
      notice.textContent = `Could not cancel: ${describeError(err)}`;
      notice.hidden = false;
    }
    control.cancelling = false;
    button.textContent = "Cancel job";
    await onCancelled();
  });
  return control;
}

/** The head of job jobId's page: {head, notice, failureBox, stats} to place, refresh(job) each poll.
 * onCancelled runs after a cancel was posted (the page polls at once). */
export function jobHeader(jobId, base, onCancelled) {
  const changed = changeTracker();
  let job = null;
  const title = h("h1", { class: "page-title job-title", dataset: { testid: "job-name" } }, "Loading…");
  const badgeSlot = h("span", { class: "job-state", dataset: { testid: "job-state" } });
  const reason = h("div", { class: "job-reason muted" });
  const idLine = h("p", { class: "job-id mono muted small" }, jobId);
  const notice = h("p", { class: "inline-error", hidden: true, role: "status" });
  const cancel = cancelControl(base, () => job, notice, onCancelled);
  // A failed job's reason and its failing worker's last lines, open (not behind a disclosure).
  const failureBox = h("section", { class: "failure-box", dataset: { testid: "job-failure" }, hidden: true, "aria-label": "Why this job failed" });
  const stats = h("div", { class: "kv-strip" });
  const head = h(
    "div",
    { class: "page-head job-head" },
    h("div", { class: "job-head-main" }, h("div", { class: "title-row" }, title, badgeSlot), idLine, reason),
    h("div", { class: "job-actions" }, cancel.button),
  );

  function refresh(current) {
    job = current;
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
    cancel.button.disabled = cancel.cancelling || !cancellable;
    cancel.button.hidden = !cancellable;
    replaceChildren(stats, ...jobStats(job));
  }

  return { head, notice, failureBox, stats, refresh };
}

// The job page's Attempts panel: each attempt's story, newest first, in full (nothing behind "more").
//
// A story is the attempt's number, state, when it was placed and how long it lasted, then why it ended and
// what acted on it: the coordinator's sentence (attempt_history[].ended.message, the one `mwms status`
// prints), with the job it made room for as a link, then its state changes. A failure's long reason (its
// last log lines) stays behind a disclosure under the story. The job lists its newest attempts only; a
// note says how many older ones it left out. Text, never HTML: names and notes come from users and agents.

import { clampedText, h, stateBadge } from "../dom.js";
import { formatDuration, formatShortTime, formatTime } from "../format.js";

/** The ending's sentence, with the job it names (a preemption's or reclaim's) as a link to that job. */
export function endingSentence(ended) {
  const message = String(ended.message || ended.kind || "ended");
  const jobId = ended.job_id ? String(ended.job_id) : "";
  const at = jobId ? message.indexOf(jobId) : -1;
  if (at < 0) return [message];
  const link = h("a", { href: `#/jobs/${encodeURIComponent(jobId)}`, class: "mono", dataset: { testid: "story-job-link" } }, jobId);
  return [message.slice(0, at), link, message.slice(at + jobId.length)];
}

/** "ACTIVE 12:01:02 → PREEMPTED 12:05:04": the attempt's state changes, oldest first. */
function eventTrail(events) {
  const steps = (events || []).map((event) => h("span", { class: "story-step", title: formatTime(event.at) }, `${event.to_state} ${formatShortTime(event.at)}`));
  const trail = steps.flatMap((step, i) => (i ? [h("span", { class: "arrow", "aria-label": "then" }, " → "), step] : [step]));
  return trail.length ? h("div", { class: "story-trail muted small" }, trail) : null;
}

function story(attempt) {
  const ended = attempt.ended;
  const active = !attempt.ended_at;
  const what = ended
    ? h("div", { class: "story-ending", dataset: { testid: "story-ending", kind: ended.kind || "" } }, endingSentence(ended))
    : h("div", { class: "story-ending muted", dataset: { testid: "story-ending", kind: "" } }, active ? "still going" : attempt.reason || attempt.state);
  const reason = String(attempt.reason || "");
  // The long form (a failure's last log lines) only where it says more than the sentence.
  const more = ended && reason.includes("\n") ? h("div", { class: "story-reason" }, clampedText(reason, { limit: 120 })) : null;
  return h(
    "li",
    { class: "story", dataset: { testid: "attempt-story", attempt: String(attempt.number) } },
    h(
      "div",
      { class: "story-head" },
      h("span", { class: "story-number" }, `Attempt ${attempt.number}`),
      stateBadge(attempt.state),
      h("span", { class: "muted small nowrap", title: formatTime(attempt.created_at) }, `placed ${formatShortTime(attempt.created_at)}`),
      h("span", { class: "story-lasted muted small nowrap" }, active ? "running" : `lasted ${formatDuration(attempt.created_at, attempt.ended_at)}`),
    ),
    what,
    more,
    eventTrail(attempt.events),
  );
}

/** The attempts' stories, newest first, or null when the job has none yet. */
export function attemptStories(job) {
  const history = job.attempt_history || [];
  if (!history.length) return null;
  const older = (history[0].number || 1) - 1;
  return h(
    "div",
    { class: "stories-wrap" },
    h("ol", { class: "stories", dataset: { testid: "attempt-stories" } }, [...history].reverse().map(story)),
    older > 0 ? h("p", { class: "muted small stories-older" }, `${older} older attempt${older === 1 ? "" : "s"} not listed: the job lists its newest ${history.length}.`) : null,
  );
}

// How a waiting job is shown wherever it appears (the queue, the job page): why it waits, its priority and
// when it may start. Every value is text; the kind only picks a class from a fixed list.

import { h } from "./dom.js";
import { formatShortTime, formatTime, formatUntil, parseTime, priorityBand, waitKindClass, waitKindLabel } from "./format.js";

/** A pill for why a job waits: its kind in words, coloured by kind. */
export function waitKindBadge(kind) {
  return h("span", { class: ["wait-kind", `wait-${waitKindClass(kind)}`], dataset: { kind: waitKindClass(kind) } }, waitKindLabel(kind));
}

/** "750 · high": a priority and its band. */
export function priorityText(priority) {
  const band = priorityBand(priority);
  return h("span", { class: ["priority", `priority-${band}`], dataset: { band } }, `${priority ?? "–"} · ${band}`);
}

/** The estimated start of a waiting reason: relative, with the time behind a title; "unknown" when none. */
export function estimatedStart(waiting) {
  const at = waiting && waiting.estimated_start;
  if (!at) return h("span", { class: "muted estimated-start" }, "unknown");
  return h("time", { class: "estimated-start nowrap", datetime: String(at), title: formatTime(at) }, `${formatUntil(at)} (${formatShortTime(at)})`);
}

// What a queue row's estimated start rests on (GET /api/v1/queue's estimate_basis), in words.
const ESTIMATE_BASES = { max_runtime: "from max_runtime", similar_jobs: "from similar jobs" };

/** A time to come, roughly: "about now", "about 12 min", "about 2 h 15 min", "about 3 days" (as `mwms queue`). */
export function formatAbout(seconds) {
  const minutes = Math.round(seconds / 60);
  if (minutes < 1) return "about now";
  if (minutes < 60) return `about ${minutes} min`;
  if (minutes < 48 * 60) {
    const rounded = 5 * Math.round(minutes / 5);
    const hours = Math.floor(rounded / 60);
    const rest = rounded % 60;
    return `about ${hours} h${rest ? ` ${rest} min` : ""}`;
  }
  return `about ${Math.round(minutes / (24 * 60))} days`;
}

/**
 * A queue row's estimated start for people and what it rests on: "about 12 min (14:05)" over "from similar
 * jobs"; "any time now" when the running jobs it waits for are overdue (they ran longer than similar jobs
 * did); "unknown" when nothing tells. The exact time is the element's title.
 */
export function queueEstimate(row) {
  const basis = (row && row.estimate_basis) || "unknown";
  const at = row && row.estimated_start;
  const date = parseTime(at);
  if (!date || basis === "unknown") return h("span", { class: "muted estimated-start", dataset: { basis: "unknown" } }, "unknown");
  if (basis === "overdue") {
    return h(
      "span",
      { class: "estimate", dataset: { basis: "overdue" } },
      h("span", { class: "estimated-start nowrap" }, "any time now"),
      h("div", { class: "muted small estimate-basis" }, "running jobs it waits for are overdue"),
    );
  }
  const known = Object.hasOwn(ESTIMATE_BASES, basis);
  return h(
    "span",
    { class: "estimate", dataset: { basis: known ? basis : "other" } },
    h("time", { class: "estimated-start nowrap", datetime: String(at), title: formatTime(at) }, `${formatAbout((date.getTime() - Date.now()) / 1000)} (${formatShortTime(at)})`),
    h("div", { class: "muted small estimate-basis" }, known ? ESTIMATE_BASES[basis] : "estimated"),
  );
}

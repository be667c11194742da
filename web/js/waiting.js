// How a waiting job is shown wherever it appears (the queue, the job page): why it waits, its priority and
// when it may start. Every value is text; the kind only picks a class from a fixed list.

import { h } from "./dom.js";
import { formatShortTime, formatTime, formatUntil, priorityBand, waitKindClass, waitKindLabel } from "./format.js";

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

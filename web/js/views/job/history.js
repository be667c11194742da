// The job page's State history and Attempts panels, side by side: the job's state changes, newest first,
// and each attempt's story (./attempts.js).

import { clampedText, emptyState, h, panel, replaceChildren, stateBadge } from "../../dom.js";
import { formatTime } from "../../format.js";
import { attemptStories } from "../attempts.js";
import { changeTracker } from "./changes.js";

function timelineItem(event) {
  return h(
    "li",
    { class: "timeline-item" },
    h("div", { class: "timeline-head" }, event.from_state ? [stateBadge(event.from_state), h("span", { class: "arrow", "aria-label": "to" }, "→")] : null, stateBadge(event.to_state), h("time", { class: "muted small", datetime: event.at }, formatTime(event.at))),
    event.reason ? h("div", { class: "timeline-reason" }, clampedText(event.reason, { limit: 200 })) : null,
  );
}

/** The two panels: {element, refresh(job)}. */
export function historyPanels() {
  const changed = changeTracker();
  const eventsBody = h("div");
  const attemptsBody = h("div");
  const element = h("div", { class: "grid-2" }, panel("State history", eventsBody, { id: "history" }), panel("Attempts", attemptsBody, { id: "attempts" }));

  function refresh(job) {
    if (changed("events", job.events)) {
      const items = [...job.events].reverse().map(timelineItem);
      replaceChildren(eventsBody, items.length ? h("ol", { class: "timeline", dataset: { testid: "events" } }, items) : emptyState("No state changes recorded.", null));
    }
    if (changed("attempts", job.attempt_history)) {
      replaceChildren(attemptsBody, attemptStories(job) || emptyState("No attempts yet.", "An attempt starts when all workers are placed."));
    }
  }

  return { element, refresh };
}

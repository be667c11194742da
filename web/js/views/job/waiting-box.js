// The job page's waiting box: why a waiting job waits (its `waiting` reason) and when it may start; hidden
// once the job is placed.

import { clampedText, h, replaceChildren } from "../../dom.js";
import { isWaiting } from "../../format.js";
import { estimatedStart, waitKindBadge } from "../../waiting.js";

/** The box: {element, refresh(job)}. */
export function waitingBox() {
  const element = h("section", { class: "waiting-box", dataset: { testid: "job-waiting" }, hidden: true, "aria-label": "Why this job waits" });

  function refresh(job) {
    const waiting = job.waiting || {};
    const shown = isWaiting(job.state) && Boolean(waiting.kind || waiting.message);
    element.hidden = !shown;
    // Rendered every poll while shown: the estimated start is relative ("in 3m").
    if (!shown) {
      element.replaceChildren();
      return;
    }
    const open = element.querySelector("details[open]") !== null;
    replaceChildren(
      element,
      h("div", { class: "waiting-head" }, h("span", { class: "waiting-title" }, "Waiting"), waiting.kind ? waitKindBadge(waiting.kind) : null),
      waiting.message ? h("div", { class: "waiting-message", dataset: { testid: "job-waiting-message" } }, clampedText(waiting.message, { limit: 240 })) : null,
      h("div", { class: "waiting-start muted small" }, "Estimated start: ", h("span", { dataset: { testid: "job-estimated-start" } }, estimatedStart(waiting))),
    );
    if (open) element.querySelector("details")?.setAttribute("open", "");
  }

  return { element, refresh };
}

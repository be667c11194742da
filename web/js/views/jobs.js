// The jobs list: every job newest first, filterable by state, refreshed every 2 s without a reload.

import { API, getJson, describeError, UnreachableError } from "../api.js";
import { h, replaceChildren, emptyState, stateBadge } from "../dom.js";
import {
  JOB_STATES,
  formatDuration,
  formatNumber,
  formatShape,
  formatShortTime,
  formatInteger,
  shortId,
} from "../format.js";
import { startPolling } from "../poll.js";

const PAGE_SIZE = 50;

const COLUMNS = [
  { label: "Name" },
  { label: "ID" },
  { label: "State" },
  { label: "Submitted by" },
  { label: "Workers × devices" },
  { label: "Step", class: "num" },
  { label: "Loss", class: "num" },
  { label: "Started" },
  { label: "Duration" },
  { label: "Attempts", class: "num" },
];

function newestFirst(a, b) {
  return String(b.created_at).localeCompare(String(a.created_at));
}

function jobRow(job) {
  const href = `#/jobs/${encodeURIComponent(job.id)}`;
  return h(
    "tr",
    { dataset: { jobId: job.id, state: job.state }, class: "job-row" },
    h("td", { class: "cell-name" }, h("a", { href, class: "job-link" }, job.name || job.id)),
    h("td", { class: "mono muted cell-id", title: job.id }, shortId(job.id)),
    h("td", { class: "cell-state", title: job.reason || null }, stateBadge(job.state)),
    h(
      "td",
      { class: "cell-user" },
      h("span", { class: "submitted-by" }, job.submitted_by || "–"),
      job.cancelled_by ? h("div", { class: "muted small cancelled-by" }, `cancelled by ${job.cancelled_by}`) : null,
    ),
    h("td", { class: "cell-shape" }, formatShape(job.workers, job.gpus_per_worker)),
    h("td", { class: "num cell-step" }, job.step === null || job.step === undefined ? "–" : formatInteger(job.step)),
    h("td", { class: "num mono cell-loss" }, formatNumber(job.loss)),
    h("td", { class: "nowrap" }, formatShortTime(job.started_at)),
    h("td", { class: "nowrap cell-duration" }, formatDuration(job.started_at, job.finished_at)),
    h("td", { class: "num cell-attempts", title: `${job.restarts} restart${job.restarts === 1 ? "" : "s"}` }, String(job.attempts)),
  );
}

/** Shows the jobs page in container; returns a function that stops it. */
export function mountJobs(container, params) {
  const stateFilter = JOB_STATES.includes(params.get("state")) ? params.get("state") : "";
  let offset = Math.max(0, Number.parseInt(params.get("offset") || "0", 10) || 0);

  const filterLink = (state, label) =>
    h(
      "a",
      {
        href: state ? `#/jobs?state=${state}` : "#/jobs",
        class: ["chip", state === stateFilter ? "active" : null, state ? `chip-${state.toLowerCase()}` : null],
        "aria-current": state === stateFilter ? "true" : null,
        dataset: { filter: state || "ALL" },
      },
      label,
    );
  const filters = h(
    "nav",
    { class: "chips", "aria-label": "Filter by state" },
    filterLink("", "All"),
    JOB_STATES.map((s) => filterLink(s, s.charAt(0) + s.slice(1).toLowerCase())),
  );
  const count = h("span", { class: "muted page-count", dataset: { testid: "jobs-total" } });
  const tbody = h("tbody");
  const tableWrap = h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      { class: "table jobs-table", dataset: { testid: "jobs-table" } },
      h("thead", null, h("tr", null, COLUMNS.map((c) => h("th", { scope: "col", class: c.class }, c.label)))),
      tbody,
    ),
  );
  const body = h("div", { class: "panel-body" });
  const error = h("p", { class: "inline-error", hidden: true, role: "status" });
  const prev = h("button", { type: "button", class: "button small", text: "← Newer" });
  const next = h("button", { type: "button", class: "button small", text: "Older →" });
  const pager = h("div", { class: "pager", hidden: true }, prev, next);

  replaceChildren(
    container,
    h("div", { class: "page-head" }, h("h1", { class: "page-title" }, "Jobs"), count),
    filters,
    error,
    h("section", { class: "panel" }, body),
    pager,
  );

  const rows = new Map();
  let lastTotal = 0;

  function render(page) {
    const jobs = [...page.jobs].sort(newestFirst);
    lastTotal = page.total;
    const first = page.total ? page.offset + 1 : 0;
    const last = page.offset + jobs.length;
    count.textContent = page.total > jobs.length ? `${first}–${last} of ${page.total}` : `${page.total} job${page.total === 1 ? "" : "s"}`;
    pager.hidden = page.total <= PAGE_SIZE;
    prev.disabled = offset === 0;
    next.disabled = last >= page.total;

    if (!jobs.length) {
      rows.clear();
      tbody.replaceChildren();
      if (stateFilter) {
        replaceChildren(
          body,
          emptyState(`No ${stateFilter.toLowerCase()} jobs.`, null),
          h("p", { class: "empty-hint center" }, h("a", { href: "#/jobs" }, "Show all jobs")),
        );
      } else {
        replaceChildren(
          body,
          emptyState(
            "No jobs yet.",
            "Submit a training program from a directory; it is bundled, uploaded and run on the agents:",
            "mwms submit DIR --workers 2 -- python train.py",
          ),
        );
      }
      return;
    }
    if (body.firstChild !== tableWrap) replaceChildren(body, tableWrap);
    // Rebuild only rows whose data changed, so hover and text selection survive the refresh.
    const seen = new Set();
    const ordered = jobs.map((job) => {
      seen.add(job.id);
      const signature = JSON.stringify(job);
      const known = rows.get(job.id);
      if (known && known.signature === signature && known.job.finished_at) return known.row;
      const row = jobRow(job);
      rows.set(job.id, { signature, row, job });
      return row;
    });
    for (const id of [...rows.keys()]) if (!seen.has(id)) rows.delete(id);
    tbody.replaceChildren(...ordered);
  }

  async function refresh() {
    try {
      const page = await getJson(`${API}/jobs`, { query: { state: stateFilter, offset, limit: PAGE_SIZE } });
      error.hidden = true;
      render(page);
    } catch (err) {
      if (!(err instanceof UnreachableError)) {
        error.textContent = `${describeError(err)} Retrying every 2 s.`;
        error.hidden = false;
      }
      throw err;
    }
  }

  const poller = startPolling(refresh, { onError: () => {} });
  prev.addEventListener("click", () => {
    offset = Math.max(0, offset - PAGE_SIZE);
    poller.now();
  });
  next.addEventListener("click", () => {
    if (offset + PAGE_SIZE < lastTotal) offset += PAGE_SIZE;
    poller.now();
  });
  return () => poller.stop();
}

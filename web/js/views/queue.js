// The queue as the scheduler sees it: every waiting job in placement order with why it waits and when it
// may start (estimated from running jobs' max_runtime, else from how long similar jobs ran, and saying
// which), and the teams' quotas against what they use now with their fair share over time (standing).
// Refreshed every 2 s like the other views.

import { API, getJson, describeError, UnreachableError } from "../api.js";
import { clampedText, emptyState, h, panel, replaceChildren, stateBadge, table } from "../dom.js";
import { formatInteger, formatNumber, formatShape } from "../format.js";
import { startPolling } from "../poll.js";
import { priorityText, queueEstimate, waitKindBadge } from "../waiting.js";

const PAGE_SIZE = 50;

const QUEUE_COLUMNS = [
  { label: "#", class: "num" },
  { label: "Job" },
  { label: "State" },
  { label: "Team" },
  { label: "User" },
  { label: "Priority", class: "num" },
  { label: "Workers × devices" },
  { label: "Waiting because" },
  { label: "Estimated start" },
];

const TEAM_COLUMNS = [{ label: "Team" }, { label: "Members" }, { label: "GPUs" }, { label: "CPU slots" }, { label: "Fair share" }];
const STANDING_HINT =
  "Standing: the team's recent use (device-hours, counting half after each half-life) over its share, in hours of its whole share. " +
  "Within a priority, the team with the lowest standing plus the part of its share in use goes first.";

function queueRow(row) {
  const waiting = row.waiting || {};
  return h(
    "tr",
    { class: "queue-row", dataset: { jobId: row.job_id, state: row.state, position: String(row.position) } },
    h("td", { class: "num cell-position" }, String(row.position)),
    h("td", { class: "cell-name" }, h("a", { href: `#/jobs/${encodeURIComponent(row.job_id)}`, class: "job-link" }, row.name || row.job_id)),
    h("td", { class: "cell-state" }, stateBadge(row.state)),
    h("td", { class: "cell-team" }, row.team || "–"),
    h("td", { class: "cell-user" }, row.submitted_by || "–"),
    h("td", { class: "num cell-priority" }, priorityText(row.priority), row.preemptible === false ? h("div", { class: "muted small" }, "not preemptible") : null),
    h("td", { class: "cell-shape nowrap" }, formatShape(row.workers, row.gpus_per_worker)),
    h(
      "td",
      { class: "cell-reason" },
      waiting.kind ? waitKindBadge(waiting.kind) : null,
      waiting.message ? h("div", { class: "wait-message" }, clampedText(waiting.message, { limit: 160 })) : null,
    ),
    h("td", { class: "cell-start" }, queueEstimate(row)),
  );
}

/** "3 / 8" with a meter against the quota, or "3 · no cap" when the kind has none. */
function quotaCell(used, cap, unit, hasQuota) {
  const inUse = Number(used || 0);
  if (cap === null || cap === undefined) {
    // A quota that leaves this kind uncapped says so; a team with no quota at all says it once, by its name.
    return h("div", { class: "quota", dataset: { used: String(inUse), cap: "none" } }, h("span", null, h("span", { class: "quota-text" }, `${formatInteger(inUse)} ${unit}`), hasQuota ? h("span", { class: "muted small" }, " · no cap") : null));
  }
  const over = inUse > cap;
  return h(
    "div",
    { class: ["quota", over ? "over" : null], dataset: { used: String(inUse), cap: String(cap) } },
    h("span", { class: "quota-text" }, `${formatInteger(inUse)} / ${formatInteger(cap)} ${unit}`),
    h("meter", { class: "usage-meter", min: 0, max: Math.max(cap, 1), value: Math.min(inUse, Math.max(cap, 1)), title: `${inUse} of a quota of ${cap} in use` }),
    over ? h("span", { class: "quota-over small" }, "borrowing idle capacity") : null,
  );
}

/** "1.2 GPU·h, 3 slot·h" (or "4 GPUs, 1 slot") of {gpus, cpu_slots}; the kinds at 0 left out. */
function amountsText(amounts, [gpu, gpus], [slot, slots]) {
  const parts = [];
  for (const [value, one, many] of [[Number(amounts?.gpus), gpu, gpus], [Number(amounts?.cpu_slots), slot, slots]]) {
    if (value > 0) parts.push(`${formatNumber(value)} ${value === 1 ? one : many}`);
  }
  return parts.join(", ");
}

/** A team's fair share over time: its standing, and the recent use and share it rests on. */
function fairShareCell(team) {
  if (team.standing === undefined || team.standing === null) return h("span", { class: "muted" }, "–");
  const used = amountsText(team.usage_device_hours, ["GPU·h", "GPU·h"], ["slot·h", "slot·h"]) || "no recent use";
  const share = amountsText(team.share, ["GPU", "GPUs"], ["slot", "slots"]) || "no devices online";
  return h(
    "div",
    { class: "fair-share", dataset: { standing: String(team.standing) }, title: STANDING_HINT },
    h("span", { class: "standing" }, `standing ${formatNumber(Number(team.standing))} h`),
    h("span", { class: "muted small fair-share-basis" }, `${used} of a share of ${share}`),
  );
}

function teamRow(team) {
  const quota = team.quota || null;
  const used = team.in_use || {};
  const members = team.members || [];
  return h(
    "tr",
    { class: "team-row", dataset: { team: team.team, quota: quota ? "yes" : "no" } },
    h("td", { class: "cell-name" }, h("div", { class: "strong team-name" }, team.team), quota ? null : h("div", { class: "muted small" }, "no quota")),
    h("td", { class: "cell-members" }, members.length ? h("span", { class: "tags" }, members.map((member) => h("code", { class: "tag" }, member))) : h("span", { class: "muted" }, "a team of one")),
    h("td", { class: "cell-gpus" }, quotaCell(used.gpus, quota ? quota.gpus : null, "GPUs", Boolean(quota))),
    h("td", { class: "cell-cpus" }, quotaCell(used.cpu_slots, quota ? quota.cpu_slots : null, "slots", Boolean(quota))),
    h("td", { class: "cell-fair-share" }, fairShareCell(team)),
  );
}

/** Shows the queue page in container; returns a function that stops it. */
export function mountQueue(container, params) {
  let offset = Math.max(0, Number.parseInt(params.get("offset") || "0", 10) || 0);
  const count = h("span", { class: "muted page-count", dataset: { testid: "queue-total" } });
  const error = h("p", { class: "inline-error", hidden: true, role: "status" });
  const queueBody = h("div");
  const teamsBody = h("div");
  const teamsNote = h("p", { class: "muted small teams-note", hidden: true });
  const prev = h("button", { type: "button", class: "button small", text: "← Earlier" });
  const next = h("button", { type: "button", class: "button small", text: "Later →" });
  const pager = h("div", { class: "pager", hidden: true }, prev, next);
  replaceChildren(
    container,
    h("div", { class: "page-head" }, h("h1", { class: "page-title" }, "Queue"), count),
    h("p", { class: "muted page-hint" }, "Waiting jobs in the order the scheduler places them, with why each one waits."),
    error,
    panel("Waiting jobs", queueBody, { id: "queue", className: "queue-panel" }),
    pager,
    panel("Teams", [teamsNote, teamsBody], { id: "teams", className: "teams-panel" }),
  );

  let lastTotal = 0;
  let signatures = {};
  const changed = (key, value) => {
    const signature = JSON.stringify(value);
    if (signatures[key] === signature) return false;
    signatures[key] = signature;
    return true;
  };

  function renderQueue(page) {
    const rows = page.jobs || [];
    lastTotal = page.total || 0;
    const first = lastTotal ? page.offset + 1 : 0;
    const last = page.offset + rows.length;
    count.textContent = lastTotal > rows.length ? `${first}–${last} of ${lastTotal} waiting` : `${lastTotal} job${lastTotal === 1 ? "" : "s"} waiting`;
    pager.hidden = lastTotal <= PAGE_SIZE;
    prev.disabled = offset === 0;
    next.disabled = last >= lastTotal;
    // Estimated starts are relative ("in 3m"), so the rows are rebuilt each time; the order is the API's.
    if (!rows.length) {
      if (changed("queue", "empty")) replaceChildren(queueBody, emptyState("Nothing is waiting.", "Every job is placed or has ended; a job that cannot be placed at once appears here with its reason."));
      return;
    }
    signatures.queue = null;
    // Keep a long reason someone opened open across the refresh.
    const open = new Set([...queueBody.querySelectorAll("tr[data-job-id] details[open]")].map((d) => d.closest("tr").dataset.jobId));
    replaceChildren(queueBody, table(QUEUE_COLUMNS, rows.map(queueRow), { class: "queue-table", attrs: { "data-testid": "queue-table" } }));
    for (const row of queueBody.querySelectorAll("tr[data-job-id]")) {
      if (open.has(row.dataset.jobId)) row.querySelector("details")?.setAttribute("open", "");
    }
  }

  function renderTeams(teams) {
    if (!changed("teams", teams)) return;
    if (!teams.length) {
      replaceChildren(teamsBody, emptyState("No teams yet.", "Every user is a team of their own until an admin adds them to one:", "mwms team add TEAM USER"));
      return;
    }
    replaceChildren(teamsBody, table(TEAM_COLUMNS, teams.map(teamRow), { class: "teams-table", attrs: { "data-testid": "teams-table" } }));
  }

  async function refresh() {
    const [queue, teams] = await Promise.allSettled([
      getJson(`${API}/queue`, { query: { offset, limit: PAGE_SIZE } }),
      getJson(`${API}/teams`),
    ]);
    if (queue.status === "fulfilled") renderQueue(queue.value);
    if (teams.status === "fulfilled") {
      teamsNote.hidden = true;
      renderTeams(teams.value);
    } else if (!(teams.reason instanceof UnreachableError)) {
      teamsNote.textContent = `Teams could not be read: ${describeError(teams.reason)}`;
      teamsNote.hidden = false;
    }
    const failure = queue.status === "rejected" ? queue.reason : null;
    if (failure && !(failure instanceof UnreachableError)) {
      error.textContent = `${describeError(failure)} Retrying every 2 s.`;
      error.hidden = false;
    } else if (!failure) {
      error.hidden = true;
    }
    if (failure) throw failure;
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

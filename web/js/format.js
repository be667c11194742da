// Formatting numbers, sizes, times and durations for display.

const TERMINAL_JOB_STATES = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);

export const JOB_STATES = ["PENDING", "SCHEDULED", "RUNNING", "RESTARTING", "PREEMPTING", "SUCCEEDED", "FAILED", "CANCELLED"];

// States of a job that waits to be placed (again): the queue's, and the job page's "why it waits".
const WAITING_JOB_STATES = new Set(["PENDING", "RESTARTING", "PREEMPTING"]);

export function isWaiting(state) {
  return WAITING_JOB_STATES.has(state);
}

// Why a job waits (the `kind` of its `waiting` reason, server/services/scheduler/wait_reasons.py), in words.
const WAIT_KINDS = {
  over_quota: "over quota",
  no_fit: "no fit",
  reserved: "reserved",
  behind_priority: "behind priority",
  cordoned: "cordoned",
  pinned: "pinned",
  backoff: "backoff",
  preempting: "preempting",
};

/** The words for a waiting reason's kind; an unknown kind is shown as it came. */
export function waitKindLabel(kind) {
  return Object.hasOwn(WAIT_KINDS, kind) ? WAIT_KINDS[kind] : String(kind || "waiting");
}

/** A class-safe name for a waiting reason's kind ("other" for one the dashboard does not know). */
export function waitKindClass(kind) {
  return Object.hasOwn(WAIT_KINDS, kind) ? kind.replaceAll("_", "-") : "other";
}

/** The band of a priority, as the coordinator counts it: low < 250 <= normal < 750 <= high. */
export function priorityBand(priority) {
  const value = Number(priority);
  if (!Number.isFinite(value)) return "normal";
  return value < 250 ? "low" : value < 750 ? "normal" : "high";
}

/** "in 3m 20s", "any moment" once the time has come, "unknown" when there is none. */
export function formatUntil(value) {
  const date = parseTime(value);
  if (!date) return "unknown";
  const seconds = (date.getTime() - Date.now()) / 1000;
  if (seconds < 1) return "any moment";
  return `in ${formatSeconds(seconds)}`;
}

export function isTerminal(state) {
  return TERMINAL_JOB_STATES.has(state);
}

/** A Date from an API timestamp; timestamps without a zone are UTC. */
export function parseTime(value) {
  if (!value) return null;
  const text = String(value);
  const hasZone = /(Z|[+-]\d\d:?\d\d)$/.test(text);
  const date = new Date(hasZone ? text : `${text}Z`);
  return Number.isNaN(date.getTime()) ? null : date;
}

const pad = (n) => String(n).padStart(2, "0");

/** "2024-05-01 14:03:22" in the browser's time zone. */
export function formatTime(value) {
  const date = parseTime(value);
  if (!date) return "–";
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
}

/** "14:03:22" for today, the full time otherwise. */
export function formatShortTime(value) {
  const date = parseTime(value);
  if (!date) return "–";
  const now = new Date();
  if (date.toDateString() === now.toDateString()) return `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
  return formatTime(value);
}

/** "1h 04m", "3m 20s", "12s" from seconds. */
export function formatSeconds(totalSeconds) {
  if (totalSeconds === null || totalSeconds === undefined || !Number.isFinite(totalSeconds)) return "–";
  const s = Math.max(0, Math.round(totalSeconds));
  const days = Math.floor(s / 86400);
  const hours = Math.floor((s % 86400) / 3600);
  const minutes = Math.floor((s % 3600) / 60);
  const seconds = s % 60;
  if (days) return `${days}d ${pad(hours)}h`;
  if (hours) return `${hours}h ${pad(minutes)}m`;
  if (minutes) return `${minutes}m ${pad(seconds)}s`;
  return `${seconds}s`;
}

/** How long something ran: from start to end, or to now while it runs. */
export function formatDuration(start, end) {
  const from = parseTime(start);
  if (!from) return "–";
  const to = parseTime(end) || new Date();
  return formatSeconds((to.getTime() - from.getTime()) / 1000);
}

/** "5 s ago", "3 min ago", or the time when it is long ago. */
export function formatAgo(value) {
  const date = parseTime(value);
  if (!date) return "never";
  const seconds = (Date.now() - date.getTime()) / 1000;
  if (seconds < 1.5) return "just now";
  if (seconds < 90) return `${Math.round(seconds)} s ago`;
  if (seconds < 90 * 60) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 36 * 3600) return `${Math.round(seconds / 3600)} h ago`;
  return formatTime(value);
}

/** A metric value with 4 significant digits, in plain or scientific notation as fits. */
export function formatNumber(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  if (!Number.isFinite(value)) return String(value);
  if (value === 0) return "0";
  const magnitude = Math.abs(value);
  if (magnitude >= 1e6 || magnitude < 1e-3) return value.toExponential(3);
  if (Number.isInteger(value)) return String(value);
  return String(Number(value.toPrecision(4)));
}

export function formatInteger(value) {
  if (value === null || value === undefined) return "–";
  return Number(value).toLocaleString("en-US");
}

/** "1.5 GiB" from bytes. */
export function formatBytes(bytes) {
  if (bytes === null || bytes === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = Number(bytes);
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(value >= 100 ? 0 : 1)} ${units[unit]}`;
}

/** "2 × 1 GPU", "4 × 2 GPUs", "2 × CPU". */
export function formatShape(workers, gpusPerWorker) {
  const devices = gpusPerWorker > 0 ? `${gpusPerWorker} GPU${gpusPerWorker === 1 ? "" : "s"}` : "CPU";
  return `${workers} × ${devices}`;
}

/** A command line as a shell would accept it, quoting words that need it. */
export function shellJoin(argv) {
  return (argv || [])
    .map((word) => (/^[\w@%+=:,./-]+$/.test(word) ? word : `'${String(word).replaceAll("'", "'\\''")}'`))
    .join(" ");
}

export function shortId(id) {
  // Job ids are 12 characters: shown whole, so they can be pasted into `mwms status`.
  return String(id || "");
}

// Device telemetry in the dashboard: each task's GPU utilisation and memory over time on the job page, and
// each agent's GPUs as they are now on the agents page. Data: GET /api/v1/jobs/{id}/devices and
// GET /api/v1/devices (server/api/devices.py); samples come from NVML on the agents every few seconds.

import { API, describeError, getJson } from "../api.js";
import { MetricChart } from "../chart.js";
import { h, panel } from "../dom.js";
import { formatAgo, formatSeconds, isTerminal, parseTime } from "../format.js";

// While a job runs its devices are fetched at most this often; after it ends, twice more, then no longer.
const REFRESH_MS = 5000;
const STALE_AFTER_S = 60;

function gib(mib) {
  return (mib / 1024).toFixed(mib >= 10 * 1024 ? 0 : 1);
}

/** The points of one chart: x = seconds since the earliest task start, one series per task and device. */
function chartPoints(tasks, origin, valueOf) {
  const points = [];
  for (const task of tasks) {
    for (const series of task.series) {
      const key = task.task_index * 1000 + series.index;
      for (const p of series.points) {
        const at = parseTime(p.at);
        if (!at) continue;
        points.push({ attempt: key, step: Math.round((at.getTime() - origin) / 1000), value: valueOf(p) });
      }
    }
  }
  return points.sort((a, b) => a.attempt - b.attempt || a.step - b.step);
}

const seriesLabel = (key) => `task ${Math.floor(key / 1000)} · GPU ${key % 1000}`;

/** The job page's "Devices" panel: hidden for CPU-only jobs, one utilisation and one memory chart otherwise. */
export class JobDevices {
  constructor(jobId) {
    this.url = `${API}/jobs/${encodeURIComponent(jobId)}/devices`;
    this.lastFetch = 0;
    this.fetchesAfterEnd = 0;
    this.note = h("p", { class: "muted small devices-note" });
    const options = { xTitle: "since start", formatX: formatSeconds, describeX: (s) => `${formatSeconds(s)} after start`, seriesLabel, markRestarts: false };
    this.utilization = new MetricChart("GPU utilisation %", options);
    this.memory = new MetricChart("GPU memory used (GiB)", options);
    this.charts = h("div", { class: "charts device-charts" }, this.utilization.element, this.memory.element);
    this.element = panel("Devices", h("div", null, this.note, this.charts), { id: "devices", className: "devices-panel" });
    this.element.dataset.testid = "job-devices";
    this.element.hidden = true;
  }

  dispose() {
    this.utilization.dispose();
    this.memory.dispose();
  }

  /** Called on every poll of the job; fetches the series when due. Never throws: a failure is said in the panel. */
  async refresh(job) {
    if (!job || !job.gpus_per_worker) {
      this.element.hidden = true; // a CPU-only job: no GPU telemetry to show
      return;
    }
    const ended = isTerminal(job.state);
    // The last samples are written up to a second after the end: look twice, then no more.
    if (ended && this.fetchesAfterEnd >= 2) return;
    if (!ended && Date.now() - this.lastFetch < REFRESH_MS) return;
    this.lastFetch = Date.now();
    let found;
    try {
      found = await getJson(this.url);
    } catch (err) {
      this.note.textContent = `Could not load device telemetry: ${describeError(err)}`;
      return;
    }
    if (ended) this.fetchesAfterEnd += 1;
    this.render(found);
  }

  render(found) {
    this.element.hidden = false;
    const tasks = found.tasks.filter((t) => t.device_kind === "gpu");
    const starts = tasks.map((t) => parseTime(t.started_at)).filter(Boolean).map((d) => d.getTime());
    const withPoints = tasks.filter((t) => t.series.some((s) => s.points.length));
    this.element.dataset.series = String(tasks.reduce((n, t) => n + t.series.filter((s) => s.points.length).length, 0));
    if (!withPoints.length || !starts.length) {
      this.charts.hidden = true;
      this.note.textContent = starts.length
        ? "No GPU telemetry from this job's agents yet (they sample every few seconds through NVML)."
        : "The tasks have not started yet.";
      return;
    }
    this.charts.hidden = false;
    const origin = Math.min(...starts);
    this.note.textContent = `Attempt ${found.attempt} · one point per ${found.bucket_seconds} s (mean utilisation, highest memory use).`;
    this.utilization.update(chartPoints(tasks, origin, (p) => p.utilization_pct));
    this.memory.update(chartPoints(tasks, origin, (p) => Number(gib(p.memory_used_mib))));
  }
}

/** The newest sample of every agent's devices, by agent id (GET /api/v1/devices). */
export async function latestDevicesByAgent() {
  const all = await getJson(`${API}/devices`);
  return new Map(all.map((a) => [a.agent_id, a.devices]));
}

/** One line per GPU for the agents page: utilisation meter, memory, temperature, and how old the sample is. */
export function deviceReadings(samples) {
  if (!samples || !samples.length) return null;
  return h(
    "ul",
    { class: "device-readings", dataset: { testid: "device-readings" } },
    samples.map((s) => {
      const age = (Date.now() - (parseTime(s.at)?.getTime() || 0)) / 1000;
      return h(
        "li",
        { class: ["device-reading", age > STALE_AFTER_S ? "stale" : null], dataset: { index: String(s.index), utilization: String(s.utilization_pct) }, title: `sampled ${formatAgo(s.at)}` },
        h("span", { class: "device-index mono" }, `GPU ${s.index}`),
        h("meter", { class: "device-util", min: 0, max: 100, value: s.utilization_pct }),
        h("span", { class: "device-util-text" }, `${Math.round(s.utilization_pct)}%`),
        h("span", { class: "device-mem muted" }, `${gib(s.memory_used_mib)}/${gib(s.memory_total_mib)} GiB`),
        h("span", { class: "device-temp muted" }, `${Math.round(s.temperature_c)} °C`),
      );
    }),
  );
}

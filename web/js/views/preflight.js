// The job page's "Preflight" panel: what the gang's preflight check found before the program ran, per attempt
// and task — peers reached, raw TCP bandwidth (mwms doctor), all-reduce algbw/busbw for 1 MB and 64 MB, or
// what failed. Data: GET /api/v1/jobs/{id}/preflight (server/api/preflight.py). Hidden when no check ran.

import { API, describeError, getJson } from "../api.js";
import { clampedText, h, panel, replaceChildren, table } from "../dom.js";
import { isTerminal } from "../format.js";

// While a job runs its results are fetched at most this often; after it ends, twice more, then no longer.
const REFRESH_MS = 3000;

const gbps = (value) => (typeof value === "number" ? value.toFixed(3) : "–");
const sizeLabel = (bytes) => `${bytes / (1 << 20)} MB`;

export class JobPreflight {
  constructor(jobId) {
    this.url = `${API}/jobs/${encodeURIComponent(jobId)}/preflight`;
    this.lastFetch = 0;
    this.fetchesAfterEnd = 0;
    this.signature = "";
    this.body = h("div", { class: "preflight-body" });
    this.element = panel("Preflight check", this.body, { id: "preflight", className: "preflight-panel" });
    this.element.dataset.testid = "job-preflight";
    this.element.hidden = true;
  }

  /** Called on every poll of the job; fetches the results when due. Never throws: a failure is said in the panel. */
  async refresh(job) {
    if (!job) return;
    const ended = isTerminal(job.state);
    if (ended && this.fetchesAfterEnd >= 2) return;
    if (!ended && Date.now() - this.lastFetch < REFRESH_MS) return;
    this.lastFetch = Date.now();
    let found;
    try {
      found = await getJson(this.url);
    } catch (err) {
      if (!this.element.hidden) replaceChildren(this.body, h("p", { class: "inline-error" }, `Could not load the preflight results: ${describeError(err)}`));
      return;
    }
    if (ended) this.fetchesAfterEnd += 1;
    this.render(found.attempts);
  }

  render(attempts) {
    const signature = JSON.stringify(attempts);
    if (signature === this.signature) return;
    this.signature = signature;
    this.element.hidden = !attempts.length;
    if (!attempts.length) return;
    // Newest attempt first: it is the one that ran (or failed) last.
    replaceChildren(this.body, [...attempts].reverse().map((attempt) => this.attemptTable(attempt)));
  }

  attemptTable(attempt) {
    const sizes = [...new Set(attempt.results.flatMap((r) => (r.report.allreduce || []).map((a) => a.bytes)))].sort((a, b) => a - b);
    const hasTcp = attempt.results.some((r) => r.report.tcp);
    const columns = [
      { label: "Task" },
      { label: "Result" },
      { label: "Peers reached", class: "num" },
      ...(hasTcp ? [{ label: "TCP → next GB/s", class: "num" }] : []),
      ...sizes.flatMap((size) => [
        { label: `${sizeLabel(size)} algbw GB/s`, class: "num" },
        { label: `${sizeLabel(size)} busbw GB/s`, class: "num" },
      ]),
    ];
    const rows = attempt.results.map((result) => {
      const report = result.report || {};
      const bySize = new Map((report.allreduce || []).map((a) => [a.bytes, a]));
      const reached = typeof report.reachable_s === "number" && result.ok ? `in ${report.reachable_s.toFixed(2)} s` : "–";
      return h(
        "tr",
        { class: result.ok ? "preflight-ok" : "preflight-failed", dataset: { task: String(result.task_index), ok: String(result.ok) } },
        h("td", { class: "mono" }, String(result.task_index)),
        h("td", null, result.ok ? h("span", { class: "badge state-succeeded" }, "passed") : h("span", null, h("span", { class: "badge state-failed" }, "failed"), " ", clampedText(result.message, { limit: 200, className: "preflight-message" }))),
        h("td", { class: "num" }, reached),
        ...(hasTcp ? [h("td", { class: "num" }, report.tcp ? `${gbps(report.tcp.gbps)} (→ ${report.tcp.to_worker})` : "–")] : []),
        ...sizes.flatMap((size) => [h("td", { class: "num" }, gbps(bySize.get(size)?.algbw_gbps)), h("td", { class: "num" }, gbps(bySize.get(size)?.busbw_gbps))]),
      );
    });
    const collective = attempt.results.map((r) => r.report.collective).find(Boolean);
    return h(
      "div",
      { class: "preflight-attempt", dataset: { attempt: String(attempt.attempt), ok: String(attempt.ok) } },
      h("p", { class: "muted small preflight-caption" }, `Attempt ${attempt.attempt}${collective ? ` · collective ${collective}` : ""} · busbw = algbw × 2(n−1)/n`),
      table(columns, rows, { attrs: { "data-testid": "preflight-table" } }),
    );
  }
}

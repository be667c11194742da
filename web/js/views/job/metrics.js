// The job page's Metrics panel: a live chart per reported metric (loss first). The points are read
// incrementally: each refresh asks GET .../metrics?after=<cursor> for what was stored since the last read,
// page by page, and redraws only the charts that got new points.

import { getJson } from "../../api.js";
import { MetricChart } from "../../chart.js";
import { emptyState, h, panel, replaceChildren } from "../../dom.js";
import { isTerminal } from "../../format.js";
import { chartedAfter } from "./settle.js";

/** Orders a series' points by attempt, then step (pages come in storage order). */
function byAttemptAndStep(a, b) {
  return a.attempt - b.attempt || a.step - b.step;
}

function orderMetricNames(names) {
  return [...names].sort((a, b) => (a === "loss" ? -1 : b === "loss" ? 1 : a.localeCompare(b)));
}

/** The panel of the job at base (its API URL): {element, refresh(job), charted(), dispose()}; charted() is
 * chartedStep() of the points read so far. */
export function metricsPanel(base) {
  const chartsGrid = h("div", { class: "charts" });
  const element = panel("Metrics", chartsGrid, { id: "metrics" });
  const charts = new Map();
  // The points read so far, by name, and the cursor after them: each poll reads only what is new.
  const metricPoints = new Map();
  let metricsCursor = 0;
  let chartedState = { attempt: 0, step: null };
  let charted = null;
  replaceChildren(chartsGrid, h("p", { class: "muted" }, "Loading metrics…"));

  /** Reads the points stored since the last read, page by page; returns the names that got new ones. */
  async function readNewMetrics() {
    const grown = new Set();
    let page = { more: true };
    while (page.more) {
      page = await getJson(`${base}/metrics?after=${metricsCursor}`);
      for (const point of page.points || []) {
        if (!metricPoints.has(point.name)) metricPoints.set(point.name, []);
        metricPoints.get(point.name).push(point);
        grown.add(point.name);
        chartedState = chartedAfter(chartedState, point);
      }
      metricsCursor = page.cursor ?? metricsCursor;
    }
    for (const name of grown) metricPoints.get(name).sort(byAttemptAndStep);
    charted = chartedState.step;
    return grown;
  }

  function showEmpty(job) {
    if (chartsGrid.querySelector(".empty")) return;
    replaceChildren(
      chartsGrid,
      emptyState(
        isTerminal(job?.state) ? "This job reported no metrics." : "No metrics reported yet.",
        "Report them from the training program with mwms_runtime (report(step, {'loss': loss}) or its Keras callback); they are charted here as they arrive.",
      ),
    );
  }

  async function refresh(job) {
    const grown = await readNewMetrics();
    if (!metricPoints.size) {
      showEmpty(job);
      return;
    }
    chartsGrid.querySelector(".empty")?.remove();
    chartsGrid.querySelector("p.muted")?.remove();
    for (const name of orderMetricNames(metricPoints.keys())) {
      let chart = charts.get(name);
      if (!chart) {
        chart = new MetricChart(name);
        charts.set(name, chart);
        chartsGrid.append(chart.element);
      }
      if (grown.has(name)) chart.update(metricPoints.get(name));
    }
  }

  return {
    element,
    refresh,
    charted: () => charted,
    dispose: () => charts.forEach((chart) => chart.dispose()),
  };
}

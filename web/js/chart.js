// A small hand-written SVG line chart: one metric over steps, one line per attempt, restarts marked.
// Written here instead of vendoring a chart library: it is ~300 lines and keeps the dashboard dependency-free.
//
// Non-finite values are data (a diverging loss is what a user must see): the API sends them as the
// strings "NaN", "Infinity" and "-Infinity" (mwms/metrics_line.py). They break the line and are marked
// at the plot's edge with their label: NaN and +Infinity at the top, -Infinity at the bottom; the
// y axis is scaled to the finite values only.

import { h, svg, replaceChildren } from "./dom.js";
import { formatNumber } from "./format.js";

const MARGIN = { top: 12, right: 16, bottom: 30, left: 58 };
const HEIGHT = 220;
const MARKERS = ["circle", "square", "triangle", "diamond"];
const MAX_POINTS_WITH_MARKERS = 60;

/** About count round numbers spanning [min, max]. */
export function niceTicks(min, max, count = 5) {
  if (!Number.isFinite(min) || !Number.isFinite(max)) return [];
  if (min === max) return [min];
  const span = max - min;
  const rawStep = span / count;
  const power = 10 ** Math.floor(Math.log10(rawStep));
  const error = rawStep / power;
  const step = power * (error >= 7.5 ? 10 : error >= 3.5 ? 5 : error >= 1.5 ? 2 : 1);
  const ticks = [];
  for (let tick = Math.ceil(min / step) * step; tick <= max + step * 1e-9; tick += step) {
    ticks.push(Number(tick.toPrecision(12)));
  }
  return ticks;
}

function markerShape(kind, x, y, className) {
  const r = 3.2;
  if (kind === "square") return svg("rect", { x: x - r, y: y - r, width: 2 * r, height: 2 * r, class: className });
  if (kind === "triangle") {
    return svg("path", { d: `M${x},${y - r * 1.2}L${x + r * 1.1},${y + r * 0.8}L${x - r * 1.1},${y + r * 0.8}Z`, class: className });
  }
  if (kind === "diamond") return svg("path", { d: `M${x},${y - r * 1.3}L${x + r * 1.3},${y}L${x},${y + r * 1.3}L${x - r * 1.3},${y}Z`, class: className });
  return svg("circle", { cx: x, cy: y, r, class: className });
}

/** A non-finite point at the plot's top (NaN, +Infinity) or bottom (-Infinity) edge, labelled, with a title. */
function nonFiniteMarker(point, at, attempt) {
  const low = point.value === -Infinity;
  const edge = low ? HEIGHT - MARGIN.bottom : MARGIN.top;
  const label = formatMetric(point.value);
  const tip = low ? `M${at},${edge}L${at - 5},${edge - 8}L${at + 5},${edge - 8}Z` : `M${at},${edge}L${at - 5},${edge + 8}L${at + 5},${edge + 8}Z`;
  return svg(
    "g",
    { class: "nonfinite-marker", dataset: { step: String(point.step), value: label, attempt: String(attempt) } },
    svg("title", {}, `step ${point.step}: ${label} (attempt ${attempt})`),
    svg("line", { x1: at, x2: at, y1: MARGIN.top, y2: HEIGHT - MARGIN.bottom, class: "nonfinite-line" }),
    svg("path", { d: tip, class: "nonfinite-tip" }),
    svg("text", { x: at + 7, y: low ? edge - 4 : edge + 9, class: "nonfinite-label" }, label === "NaN" ? "NaN" : label === "Infinity" ? "+∞" : "−∞"),
  );
}

function legendSwatch(attemptSlot) {
  const colour = `attempt-${attemptSlot % 6}`;
  return svg(
    "svg",
    { class: "legend-swatch", viewBox: "0 0 24 10", width: 24, height: 10, "aria-hidden": "true" },
    svg("line", { x1: 0, y1: 5, x2: 24, y2: 5, class: `series-line ${colour} dash-${attemptSlot % 4}` }),
    markerShape(MARKERS[attemptSlot % MARKERS.length], 12, 5, `series-marker ${colour}`),
  );
}

/** A metric value from the API as a number: "NaN", "Infinity", "-Infinity" (and a legacy null: NaN). */
export function metricNumber(value) {
  if (value === null || value === undefined) return NaN;
  return typeof value === "string" ? Number(value) : value;
}

/** How a value reads in the chart: non-finite values by name, as the API spells them. */
export function formatMetric(value) {
  if (Number.isNaN(value)) return "NaN";
  if (value === Infinity) return "Infinity";
  if (value === -Infinity) return "-Infinity";
  return formatNumber(value);
}

/** Groups points by attempt, each group sorted by step, attempts in order; values become numbers. */
function seriesByAttempt(points) {
  const byAttempt = new Map();
  for (const raw of points) {
    const point = { ...raw, value: metricNumber(raw.value) };
    if (typeof point.value !== "number" || !Number.isFinite(point.step)) continue;
    if (!byAttempt.has(point.attempt)) byAttempt.set(point.attempt, []);
    byAttempt.get(point.attempt).push(point);
  }
  return [...byAttempt.entries()]
    .sort((a, b) => a[0] - b[0])
    .map(([attempt, list]) => ({ attempt, points: list.sort((a, b) => a.step - b.step) }));
}

/**
 * A chart of one metric that can be redrawn with new points. The figure carries data-points (how many
 * points are drawn, non-finite ones included), data-nonfinite (how many of those are marked at an edge of
 * the plot) and data-attempts (how many attempts are told apart), for tests and tooling.
 */
export class MetricChart {
  /**
   * Options, for charts over something else than steps and attempts (device telemetry): xTitle (the x
   * axis' title), formatX(x) (tick labels), describeX(x) (the tooltip's and the latest value's "step N"),
   * seriesLabel(key) (legend and tooltip, for the points' `attempt` key), markRestarts (false: no
   * "restart → attempt" lines between series).
   */
  constructor(name, options = {}) {
    this.name = name;
    this.options = {
      xTitle: name.startsWith("epoch_") ? "epoch" : "step",
      formatX: String,
      describeX: (x) => `step ${x}`,
      seriesLabel: (key) => `attempt ${key}`,
      markRestarts: true,
      ...options,
    };
    this.points = [];
    this.signature = "";
    this.width = 0;
    this.latest = h("span", { class: "chart-latest" });
    this.plot = h("div", { class: "chart-plot" });
    this.legend = h("div", { class: "chart-legend" });
    this.tooltip = h("div", { class: "chart-tooltip", hidden: true, role: "status" });
    this.element = h(
      "figure",
      { class: "chart", dataset: { metric: name, points: "0", nonfinite: "0", attempts: "0" } },
      h("figcaption", { class: "chart-head" }, h("span", { class: "chart-name" }, name), this.latest),
      this.plot,
      this.tooltip,
      this.legend,
    );
    this.resizeObserver = new ResizeObserver(() => {
      if (this.plot.clientWidth && Math.abs(this.plot.clientWidth - this.width) > 1) this.draw();
    });
    this.resizeObserver.observe(this.plot);
  }

  dispose() {
    this.resizeObserver.disconnect();
  }

  /** Replaces the chart's points; redraws only when they changed. */
  update(points) {
    const last = points.length ? points[points.length - 1] : null;
    const signature = `${points.length}:${last ? `${last.attempt}/${last.step}/${last.value}` : ""}`;
    if (signature === this.signature) return;
    this.signature = signature;
    this.points = points;
    this.draw();
  }

  draw() {
    const series = seriesByAttempt(this.points);
    const drawnCount = series.reduce((sum, s) => sum + s.points.length, 0);
    const all = series.flatMap((s) => s.points);
    const finite = all.filter((p) => Number.isFinite(p.value));
    this.element.dataset.points = String(drawnCount);
    this.element.dataset.nonfinite = String(drawnCount - finite.length);
    this.element.dataset.attempts = String(series.length);
    const newest = series.length ? series[series.length - 1].points.at(-1) : null;
    const opts = this.options;
    this.latest.textContent = newest ? `${formatMetric(newest.value)} @ ${opts.describeX(newest.step)}` : "";
    this.latest.classList.toggle("chart-latest-nonfinite", Boolean(newest) && !Number.isFinite(newest.value));

    const width = Math.max(240, this.plot.clientWidth || 600);
    this.width = width;
    if (!drawnCount) {
      replaceChildren(this.plot, h("p", { class: "chart-empty" }, "No values reported yet."));
      replaceChildren(this.legend);
      return;
    }
    let minStep = Math.min(...all.map((p) => p.step));
    let maxStep = Math.max(...all.map((p) => p.step));
    if (minStep === maxStep) {
      minStep -= 1;
      maxStep += 1;
    }
    // Only finite values set the scale; with none, an arbitrary [0, 1] holds the edge markers.
    let minValue = finite.length ? Math.min(...finite.map((p) => p.value)) : 0;
    let maxValue = finite.length ? Math.max(...finite.map((p) => p.value)) : 1;
    if (minValue === maxValue) {
      const pad = Math.abs(minValue) * 0.1 || 1;
      minValue -= pad;
      maxValue += pad;
    } else {
      const pad = (maxValue - minValue) * 0.06;
      minValue -= pad;
      maxValue += pad;
    }
    const innerWidth = width - MARGIN.left - MARGIN.right;
    const innerHeight = HEIGHT - MARGIN.top - MARGIN.bottom;
    const x = (step) => MARGIN.left + ((step - minStep) / (maxStep - minStep)) * innerWidth;
    const y = (value) => MARGIN.top + (1 - (value - minValue) / (maxValue - minValue)) * innerHeight;

    const root = svg("svg", {
      class: "chart-svg",
      width,
      height: HEIGHT,
      viewBox: `0 0 ${width} ${HEIGHT}`,
      role: "img",
      "aria-label": `${this.name} over steps, ${series.length} attempt${series.length === 1 ? "" : "s"}`,
    });

    const grid = svg("g", { class: "chart-grid" });
    for (const tick of niceTicks(minValue, maxValue, 4)) {
      if (tick < minValue || tick > maxValue) continue;
      grid.append(
        svg("line", { x1: MARGIN.left, x2: width - MARGIN.right, y1: y(tick), y2: y(tick), class: "grid-line" }),
        svg("text", { x: MARGIN.left - 8, y: y(tick), class: "tick-label tick-y" }, formatNumber(tick)),
      );
    }
    const xTicks = niceTicks(minStep, maxStep, Math.max(2, Math.floor(innerWidth / 90))).filter(
      (t) => Number.isInteger(t) && t >= minStep && t <= maxStep,
    );
    for (const tick of xTicks) {
      grid.append(
        svg("line", { x1: x(tick), x2: x(tick), y1: HEIGHT - MARGIN.bottom, y2: HEIGHT - MARGIN.bottom + 4, class: "axis-tick" }),
        svg("text", { x: x(tick), y: HEIGHT - MARGIN.bottom + 17, class: "tick-label tick-x" }, opts.formatX(tick)),
      );
    }
    grid.append(
      svg("line", { x1: MARGIN.left, x2: width - MARGIN.right, y1: HEIGHT - MARGIN.bottom, y2: HEIGHT - MARGIN.bottom, class: "axis-line" }),
      // The Keras callback reports epoch_* metrics per epoch, everything else per step (options.xTitle).
      svg("text", { x: width - MARGIN.right, y: HEIGHT - 2, class: "axis-title" }, opts.xTitle),
    );
    root.append(grid);

    // A restart begins a new attempt: mark where each later attempt's first point lies.
    const restarts = svg("g", { class: "chart-restarts" });
    (opts.markRestarts ? series.slice(1) : []).forEach((s) => {
      const at = x(s.points[0].step);
      restarts.append(
        svg("line", { x1: at, x2: at, y1: MARGIN.top, y2: HEIGHT - MARGIN.bottom, class: "restart-line" }),
        svg("text", { x: at + 4, y: MARGIN.top + 10, class: "restart-label" }, `restart → attempt ${s.attempt}`),
      );
    });
    root.append(restarts);

    const withMarkers = drawnCount <= MAX_POINTS_WITH_MARKERS * Math.max(1, series.length);
    series.forEach((s, slot) => {
      const colour = `attempt-${slot % 6}`;
      const group = svg("g", { class: "series", dataset: { attempt: String(s.attempt), points: String(s.points.length) } });
      // A non-finite value breaks the line: the next finite point starts a new segment.
      let d = "";
      let pen = "M";
      for (const p of s.points) {
        if (!Number.isFinite(p.value)) {
          pen = "M";
          continue;
        }
        d += `${pen}${x(p.step).toFixed(1)},${y(p.value).toFixed(1)}`;
        pen = "L";
      }
      group.append(svg("path", { d, class: `series-line ${colour} dash-${slot % 4}` }));
      const finitePoints = s.points.filter((p) => Number.isFinite(p.value));
      if (withMarkers || finitePoints.length === 1) {
        for (const p of finitePoints) group.append(markerShape(MARKERS[slot % MARKERS.length], x(p.step), y(p.value), `series-marker ${colour}`));
      }
      for (const p of s.points) {
        if (!Number.isFinite(p.value)) group.append(nonFiniteMarker(p, x(p.step), s.attempt));
      }
      root.append(group);
    });

    const hover = svg("line", { class: "hover-line", y1: MARGIN.top, y2: HEIGHT - MARGIN.bottom, visibility: "hidden" });
    root.append(hover);
    const steps = [...new Set(all.map((p) => p.step))].sort((a, b) => a - b);
    root.addEventListener("pointermove", (event) => {
      const box = root.getBoundingClientRect();
      const px = ((event.clientX - box.left) / box.width) * width;
      const step = minStep + ((px - MARGIN.left) / innerWidth) * (maxStep - minStep);
      let nearest = steps[0];
      for (const candidate of steps) if (Math.abs(candidate - step) < Math.abs(nearest - step)) nearest = candidate;
      hover.setAttribute("x1", x(nearest));
      hover.setAttribute("x2", x(nearest));
      hover.setAttribute("visibility", "visible");
      const rows = series
        .map((s, slot) => ({ s, slot, point: s.points.find((p) => p.step === nearest) }))
        .filter((r) => r.point)
        .map((r) => h("div", { class: "tooltip-row" }, legendSwatch(r.slot), `${opts.seriesLabel(r.s.attempt)}: ${formatMetric(r.point.value)}`));
      replaceChildren(this.tooltip, h("div", { class: "tooltip-step" }, opts.describeX(nearest)), rows);
      this.tooltip.hidden = false;
      const left = (x(nearest) / width) * box.width;
      this.tooltip.style.left = `${Math.min(Math.max(left, 70), box.width - 70)}px`;
    });
    root.addEventListener("pointerleave", () => {
      hover.setAttribute("visibility", "hidden");
      this.tooltip.hidden = true;
    });

    replaceChildren(this.plot, root);
    replaceChildren(
      this.legend,
      series.map((s, slot) =>
        h("span", { class: "legend-item" }, legendSwatch(slot), opts.seriesLabel(s.attempt), h("span", { class: "legend-count" }, ` · ${s.points.length} pts`)),
      ),
    );
  }
}

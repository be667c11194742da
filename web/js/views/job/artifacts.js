// The job page's Artifacts panel: the files the job's tasks uploaded (path as a download link, size,
// sha256, attempt, when saved). Data: GET /api/v1/jobs/{id}/artifacts.

import { artifactUrl, getJson } from "../../api.js";
import { emptyState, h, panel, replaceChildren, table } from "../../dom.js";
import { formatBytes, formatShortTime } from "../../format.js";
import { changeTracker } from "./changes.js";

function artifactRow(jobId, artifact) {
  return h(
    "tr",
    null,
    h("td", { class: "cell-path" }, h("a", { href: artifactUrl(jobId, artifact.path), download: artifact.path.split("/").pop(), class: "mono", title: artifact.path }, artifact.path)),
    h("td", { class: "num nowrap" }, formatBytes(artifact.size)),
    h("td", { class: "mono muted small", title: artifact.sha256 }, artifact.sha256.slice(0, 12)),
    h("td", { class: "num" }, String(artifact.attempt)),
    h("td", { class: "nowrap" }, formatShortTime(artifact.created_at)),
  );
}

/** The panel of job jobId at base (its API URL): {element, read(), render(artifacts)}; read() fetches the
 * list, render() shows it (redrawn only when it changed). */
export function artifactsPanel(jobId, base) {
  const changed = changeTracker();
  const body = h("div");
  const element = panel("Artifacts", body, { id: "artifacts" });

  function render(artifacts) {
    if (!changed("artifacts", artifacts)) return;
    if (!artifacts.length) {
      replaceChildren(body, emptyState("No artifacts.", "Files the program saves under mwms_runtime's artifact directory are uploaded when a task ends and listed here."));
      return;
    }
    const rows = artifacts.map((artifact) => artifactRow(jobId, artifact));
    const columns = [{ label: "Path" }, { label: "Size", class: "num" }, { label: "sha256" }, { label: "Attempt", class: "num" }, { label: "Saved" }];
    replaceChildren(body, table(columns, rows, { class: "artifacts-table", attrs: { "data-testid": "artifacts-table" } }));
  }

  return { element, read: () => getJson(`${base}/artifacts`), render };
}

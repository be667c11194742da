// The job page's Spec panel: what was submitted (command, shape, resources, bundle, Python environment,
// environment variables, communication, restarts, timeouts, pinned agents) and when it was created and ended.

import { h, panel, replaceChildren } from "../../dom.js";
import { formatBytes, formatSeconds, formatShape, formatTime, shellJoin } from "../../format.js";
import { changeTracker } from "./changes.js";

/** The task's own environment on its agent, in a few words: "building", "built in 3.2 s", "from the cache". */
export function environmentStatus(task) {
  if (task.environment === "building") return "building";
  if (task.environment !== "ready") return "waiting";
  const seconds = task.environment_build_seconds;
  return seconds ? `built in ${seconds.toFixed(1)} s` : "from the cache";
}

/** The job's own Python environment (submit --requirements): its file, Python, where each worker's build
 * stands, and the resolved packages behind a disclosure; or the agents' own. */
export function pythonEnvironment(job) {
  const environment = job.environment;
  if (!environment) return h("span", { class: "muted", dataset: { testid: "python-environment" } }, "the agents' own");
  const packages = environment.packages || [];
  const builds = (job.tasks || []).map((task) => `worker ${task.index}: ${environmentStatus(task)}`);
  return h(
    "div",
    { dataset: { testid: "python-environment" } },
    h("div", null, h("code", { class: "mono" }, environment.requirements || "requirements"), ` · Python ${environment.python || "of the agents"} · ${new Set(packages.map((p) => p.split("==")[0].toLowerCase().replaceAll("_", "-"))).size} packages · ${environment.isolated ? "isolated" : "over the agents' runtime"}`),
    builds.length ? h("div", { class: "muted small", dataset: { testid: "python-environment-builds" } }, builds.join(" · ")) : null,
    h(
      "details",
      { class: "small" },
      h("summary", null, "Resolved packages"),
      h("ul", { class: "mono package-list", dataset: { testid: "python-environment-packages" } }, packages.map((name) => h("li", null, name))),
    ),
  );
}

function definitionList(entries) {
  return h(
    "dl",
    { class: "deflist" },
    entries.map(([term, value]) => [h("dt", null, term), h("dd", null, value)]),
  );
}

/** The spec's entries, [term, value] in order. */
function specEntries(job) {
  const communication = job.communication || {};
  const restart = job.restart || {};
  return [
    ["Command", h("code", { class: "mono wrap" }, shellJoin(job.command))],
    ["Workers", formatShape(job.workers, job.gpus_per_worker)],
    ["Memory per worker", job.memory_per_worker ? formatBytes(job.memory_per_worker) : "the agent's share"],
    ["CPUs per worker", job.cpus_per_worker ? String(job.cpus_per_worker) : "no cap"],
    ["Bundle", h("code", { class: "mono wrap", title: job.bundle_digest }, `sha256:${job.bundle_digest}`)],
    ["Python environment", pythonEnvironment(job)],
    ["Environment", job.env_names && job.env_names.length ? h("span", { class: "tags" }, job.env_names.map((name) => h("code", { class: "tag" }, name))) : h("span", { class: "muted" }, "none")],
    [
      "Communication",
      `${communication.implementation || "default"}` +
        `${communication.timeout_seconds ? `, timeout ${formatSeconds(communication.timeout_seconds)}` : ""}` +
        `${communication.bytes_per_pack ? `, ${formatBytes(communication.bytes_per_pack)} per pack` : ""}`,
    ],
    ["Restarts", `up to ${restart.max_restarts ?? "–"} on ${restart.restart_on || "–"} failures`],
    ["Startup timeout", job.startup_timeout_seconds ? formatSeconds(job.startup_timeout_seconds) : "server default"],
    ["Max runtime", job.max_runtime_seconds ? formatSeconds(job.max_runtime_seconds) : "unlimited"],
    ["Preflight check", job.preflight == null ? "server default" : job.preflight ? "on" : "off"],
    ...(job.agents ? [["Pinned to", h("span", { class: "tags" }, job.agents.map((name, i) => h("code", { class: "tag", title: `worker ${i}` }, name)))]] : []),
    ["Created", formatTime(job.created_at)],
    ["Finished", formatTime(job.finished_at)],
  ];
}

/** The panel: {element, refresh(job)}; redrawn only when the spec or a worker's environment build changed. */
export function specPanel() {
  const changed = changeTracker();
  const body = h("div");
  const element = panel("Spec", body, { id: "spec" });

  function refresh(job) {
    const envStates = (job.tasks || []).map((task) => [task.environment, task.environment_build_seconds]);
    if (!changed("spec", [job.command, job.bundle_digest, job.env_names, job.communication, job.restart, job.finished_at, job.environment, envStates])) return;
    replaceChildren(body, definitionList(specEntries(job)));
  }

  return { element, refresh };
}

// The agents page: each machine's devices, what runs on them, and whether it is still heard from.

import { API, getJson, describeError, UnreachableError } from "../api.js";
import { clampedText, h, panel, replaceChildren, emptyState, table } from "../dom.js";
import { formatAgo, formatBytes, formatTime } from "../format.js";
import { startPolling } from "../poll.js";
import { deviceReadings, latestDevicesByAgent } from "./devices.js";

/** "2 × NVIDIA H100 80GB HBM3 · 80 GiB" per distinct model, or "4 CPU slots". */
function describeDevices(devices) {
  const gpus = devices.filter((d) => d.kind === "gpu");
  const cpus = devices.filter((d) => d.kind !== "gpu");
  const lines = [];
  const models = new Map();
  for (const gpu of gpus) {
    const key = `${gpu.name}|${gpu.memory_mib}`;
    models.set(key, { gpu, count: (models.get(key)?.count || 0) + 1 });
  }
  for (const { gpu, count } of models.values()) {
    const memory = gpu.memory_mib ? ` · ${(gpu.memory_mib / 1024).toFixed(gpu.memory_mib % 1024 ? 1 : 0)} GiB` : "";
    lines.push(h("div", { class: "device-line" }, h("span", { class: "device-kind gpu" }, "GPU"), `${count} × ${gpu.name || "GPU"}${memory}`));
  }
  if (cpus.length) {
    lines.push(h("div", { class: "device-line" }, h("span", { class: "device-kind cpu" }, "CPU"), `${cpus.length} slot${cpus.length === 1 ? "" : "s"}`));
  }
  if (!lines.length) lines.push(h("span", { class: "muted" }, "none reported"));
  return lines;
}

function usageBar(used, free) {
  const total = used + free;
  const meter = h("meter", { min: 0, max: Math.max(total, 1), value: used, class: "usage-meter", title: `${used} of ${total} in use` });
  return h("div", { class: "usage" }, h("span", { class: "usage-text" }, `${used} / ${total}`), meter);
}

function taskLinks(tasks) {
  if (!tasks.length) return h("span", { class: "muted" }, "idle");
  return h(
    "ul",
    { class: "task-list" },
    tasks.map((task) =>
      h(
        "li",
        null,
        h("a", { href: `#/jobs/${encodeURIComponent(task.job_id)}` }, task.job_name || task.job_id),
        h("span", { class: "muted" }, ` · task ${task.task_index} · attempt ${task.attempt} · ${task.state}`),
        task.device_indices.length ? h("span", { class: "muted" }, ` · devices ${task.device_indices.join(",")}`) : null,
      ),
    ),
  );
}

/**
 * Whether the agent takes new work: drained (cordoned, and nothing of its jobs left on it), draining (its jobs
 * are being preempted and placed elsewhere) or cordoned (no new placements), with who did it, when and why.
 * Nothing for an agent in service.
 */
function cordonStatus(agent) {
  if (!agent.cordoned && !agent.draining && !agent.drained) return null;
  const state = agent.drained ? "drained" : agent.draining ? "draining" : "cordoned";
  const who = agent.cordoned_by ? `by ${agent.cordoned_by}` : null;
  const when = agent.cordoned_at ? h("span", { title: formatTime(agent.cordoned_at) }, formatAgo(agent.cordoned_at)) : null;
  return h(
    "div",
    { class: "cordon", dataset: { testid: "agent-cordon", cordon: state } },
    h("span", { class: ["cordon-tag", `cordon-${state}`] }, state),
    who || when ? h("div", { class: "muted small cordon-who" }, who, who && when ? " · " : null, when) : null,
    agent.cordon_reason ? h("div", { class: "small cordon-reason" }, clampedText(agent.cordon_reason, { limit: 120 })) : null,
  );
}

// online, stopped (it said goodbye: a clean stop), lost or removed (AgentOut.state); from `online` without one.
function agentState(agent) {
  return agent.state || (agent.online ? "online" : "lost");
}

function agentRow(agent, readings) {
  const state = agentState(agent);
  return h(
    "tr",
    { dataset: { agentId: agent.id, online: String(agent.online), state }, class: agent.online ? null : "row-lost" },
    h("td", { class: "cell-name" }, h("div", { class: "strong" }, agent.name), h("div", { class: "muted small" }, agent.hostname)),
    h("td", { class: "cell-status" }, h("span", { class: ["badge", `state-${state}`] }, state), cordonStatus(agent)),
    h("td", { class: "nowrap" }, h("div", { class: "mono" }, agent.address), h("div", { class: "muted small" }, agent.port_range ? `ports ${agent.port_range}` : "")),
    h(
      "td",
      { class: "cell-devices" },
      describeDevices(agent.devices),
      agent.memory_bytes ? h("div", { class: "muted small", title: "memory the agent offers its tasks in all", dataset: { testid: "agent-memory" } }, `memory ${formatBytes(agent.memory_bytes)}`) : null,
      deviceReadings(readings),
    ),
    h("td", null, usageBar(agent.devices_used, agent.devices_free)),
    h("td", null, taskLinks(agent.tasks)),
    h("td", { class: "nowrap", title: formatTime(agent.last_heartbeat_at) }, formatAgo(agent.last_heartbeat_at)),
    h("td", { class: "muted mono small" }, agent.version || "–"),
  );
}

const COLUMNS = ["Agent", "Status", "Address", "Devices", "In use", "Running tasks", "Last heartbeat", "Version"].map(
  (label) => ({ label }),
);

const REPLICA_COLUMNS = ["Replica", "Status", "Serves", "REST", "gRPC", "Agent streams", "Runs", "Last seen", "Version"].map(
  (label) => ({ label }),
);

function replicaRow(replica) {
  const status = replica.alive ? "alive" : replica.stopped_at ? "stopped" : "gone";
  return h(
    "tr",
    { dataset: { replicaId: replica.id, alive: String(replica.alive) }, class: replica.alive ? null : "row-lost" },
    h("td", { class: "cell-name" }, h("div", { class: "strong" }, replica.name), h("div", { class: "muted small" }, `pid ${replica.pid}`)),
    h("td", null, h("span", { class: ["badge", replica.alive ? "state-online" : "state-lost"] }, status)),
    h("td", null, replica.serve),
    h("td", { class: "mono small" }, replica.http_address || "–"),
    h("td", { class: "mono small" }, replica.grpc_address || "–"),
    h("td", { class: "cell-streams" }, String(replica.agents_held)),
    h("td", { class: "small cell-loops" }, replica.loops.length ? replica.loops.join(", ") : h("span", { class: "muted" }, "–")),
    h("td", { class: "nowrap", title: formatTime(replica.seen_at) }, formatAgo(replica.seen_at)),
    h("td", { class: "muted mono small" }, replica.version || "–"),
  );
}

/** Shows the agents page in container; returns a function that stops it. */
export function mountAgents(container) {
  const count = h("span", { class: "muted page-count" });
  const body = h("div", { class: "panel-body" });
  const error = h("p", { class: "inline-error", hidden: true, role: "status" });
  // Admins also see the coordinator replicas (GET /replicas is admin-only; for others the panel stays hidden).
  const replicasBody = h("div", { class: "panel-body" });
  const replicasPanel = panel("Coordinator replicas", replicasBody, { id: "replicas", className: "replicas-panel" });
  replicasPanel.hidden = true;
  replaceChildren(
    container,
    h("div", { class: "page-head" }, h("h1", { class: "page-title" }, "Agents"), count),
    error,
    h("section", { class: "panel" }, body),
    replicasPanel,
  );

  async function refreshReplicas() {
    let replicas;
    try {
      replicas = await getJson(`${API}/replicas`);
    } catch {
      replicasPanel.hidden = true;
      return;
    }
    replicasPanel.hidden = false;
    replaceChildren(replicasBody, table(REPLICA_COLUMNS, replicas.map(replicaRow), { class: "replicas-table", attrs: { "data-testid": "replicas-table" } }));
  }

  async function refresh() {
    let agents;
    let readings = new Map(); // the newest GPU samples; the page works without them
    refreshReplicas();
    try {
      [agents, readings] = await Promise.all([getJson(`${API}/agents`), latestDevicesByAgent().catch(() => readings)]);
      error.hidden = true;
    } catch (err) {
      if (!(err instanceof UnreachableError)) {
        error.textContent = `${describeError(err)} Retrying every 2 s.`;
        error.hidden = false;
      }
      throw err;
    }
    const online = agents.filter((a) => a.online).length;
    count.textContent = `${agents.length} agent${agents.length === 1 ? "" : "s"} · ${online} online`;
    if (!agents.length) {
      replaceChildren(
        body,
        emptyState(
          "No agents have joined.",
          "Start an agent on each machine that should run training; HOST is this coordinator's address and 50051 its gRPC port:",
          "mwms agent --server HOST:50051 --name NAME",
        ),
      );
      return;
    }
    const sorted = [...agents].sort((a, b) => Number(b.online) - Number(a.online) || a.name.localeCompare(b.name));
    replaceChildren(body, table(COLUMNS, sorted.map((agent) => agentRow(agent, readings.get(agent.id))), { class: "agents-table", attrs: { "data-testid": "agents-table" } }));
  }

  const poller = startPolling(refresh, { onError: () => {} });
  return () => poller.stop();
}

// The dashboard's entry point: hash routing, the overview header, and the "coordinator unreachable" banner.

import { API, getJson, onReachabilityChange } from "./api.js";
import { formatInteger } from "./format.js";
import { POLL_INTERVAL_MS, startPolling } from "./poll.js";
import { mountAgents } from "./views/agents.js";
import { mountJob } from "./views/job.js";
import { mountJobs } from "./views/jobs.js";

const view = document.getElementById("view");
const banner = document.getElementById("banner");
const bannerText = document.getElementById("banner-text");
const updated = document.getElementById("updated");

let unmountView = null;
let overviewPoller = null;

/** {page, id, params} from location.hash: #/jobs?state=RUNNING, #/jobs/<id>, #/agents. */
function parseRoute() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [path, query = ""] = hash.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const params = new URLSearchParams(query);
  if (parts[0] === "agents") return { page: "agents", params };
  if (parts[0] === "jobs" && parts[1]) return { page: "job", id: parts[1], params };
  return { page: "jobs", params };
}

function route() {
  const { page, id, params } = parseRoute();
  if (!location.hash) history.replaceState(null, "", "#/jobs");
  if (unmountView) unmountView();
  view.replaceChildren();
  document.body.dataset.page = page;
  for (const link of document.querySelectorAll("[data-nav]")) {
    const active = link.dataset.nav === (page === "job" ? "jobs" : page);
    link.classList.toggle("active", active);
    if (active) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (page === "agents") {
    document.title = "Agents · mwms";
    unmountView = mountAgents(view);
  } else if (page === "job") {
    document.title = "Job · mwms";
    unmountView = mountJob(view, id);
  } else {
    document.title = "Jobs · mwms";
    unmountView = mountJobs(view, params);
  }
  window.scrollTo(0, 0);
}

async function refreshOverview() {
  const overview = await getJson(`${API}/overview`);
  for (const element of document.querySelectorAll("[data-stat]")) {
    const value = overview[element.dataset.stat];
    element.textContent = formatInteger(value ?? 0);
    element.classList.toggle("zero", !value);
  }
  const now = new Date();
  updated.textContent = `updated ${now.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" })}`;
}

let failures = 0;
onReachabilityChange((reachable, error) => {
  if (reachable) {
    failures = 0;
    banner.hidden = true;
    document.body.classList.remove("offline");
    return;
  }
  document.body.classList.add("offline");
  banner.hidden = false;
  bannerText.textContent = `${error ? error.message : ""}. Retrying every ${POLL_INTERVAL_MS / 1000} s; check that \`mwms server\` is running.`;
});

document.getElementById("banner-retry").addEventListener("click", () => {
  failures += 1;
  bannerText.textContent = `Retrying now (manual try ${failures})…`;
  overviewPoller.now();
});

window.addEventListener("hashchange", route);
overviewPoller = startPolling(refreshOverview, { onError: () => {} });
route();

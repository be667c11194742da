// The dashboard's entry point: log-in, hash routing, the overview header, and the "coordinator unreachable"
// banner. Nothing but the login form is shown, and nothing is fetched but /whoami, until a session exists.

import { API, ApiError, describeError, getJson, onReachabilityChange, onUnauthenticated, UnreachableError } from "./api.js";
import { formatInteger } from "./format.js";
import { mountLogin, returnTarget, showSessionHeader } from "./login.js";
import { POLL_INTERVAL_MS, startPolling } from "./poll.js";
import { currentUser, setCurrentUser } from "./session.js";
import { mountAgents } from "./views/agents.js";
import { mountJob } from "./views/job.js";
import { mountJobs } from "./views/jobs.js";
import { mountQueue } from "./views/queue.js";

const view = document.getElementById("view");
const banner = document.getElementById("banner");
const bannerText = document.getElementById("banner-text");
const updated = document.getElementById("updated");

let unmountView = null;
let overviewPoller = null;

/** {page, id, params} from location.hash: #/jobs?state=RUNNING, #/jobs/<id>, #/queue, #/agents. */
function parseRoute() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [path, query = ""] = hash.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const params = new URLSearchParams(query);
  if (parts[0] === "agents") return { page: "agents", params };
  if (parts[0] === "queue") return { page: "queue", params };
  if (parts[0] === "jobs" && parts[1]) return { page: "job", id: parts[1], params };
  return { page: "jobs", params };
}

function route() {
  if (!currentUser()) return;
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
  } else if (page === "queue") {
    document.title = "Queue · mwms";
    unmountView = mountQueue(view, params);
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
  if (overviewPoller) overviewPoller.now();
  else start();
});

/** Stops every poller and empties the page, so no data stays on screen once logged out. */
function stopApp() {
  if (overviewPoller) overviewPoller.stop();
  overviewPoller = null;
  if (unmountView) unmountView();
  unmountView = null;
  view.replaceChildren();
  const dialog = document.getElementById("confirm-dialog");
  if (dialog.open) dialog.close();
  updated.textContent = "";
  for (const element of document.querySelectorAll("[data-stat]")) element.textContent = "–";
}

/** Shows the app for principal (the answer of /whoami or of logging in). */
function enterApp(principal) {
  setCurrentUser(principal);
  showSessionHeader(principal);
  document.body.dataset.auth = "in";
  overviewPoller = startPolling(refreshOverview, { onError: () => {} });
  route();
}

/** Shows the login form, with message saying why when a session ended under the user. */
function leaveApp(message = "") {
  setCurrentUser(null);
  stopApp();
  document.body.dataset.auth = "out";
  document.title = "Log in · mwms";
  login.show(message);
}

const login = mountLogin({ onLoggedIn: enterApp, onLoggedOut: () => leaveApp() });

// Any 401 while logged in (a session that expired, was revoked or ended in another tab) returns to the
// login form, whichever view asked.
onUnauthenticated(() => {
  if (currentUser()) leaveApp("Your session has ended (expired, revoked or logged out elsewhere); log in again.");
});

let retryTimer = null;
/** Asks who is logged in, then shows the app or the login form; retries while the coordinator is unreachable. */
async function start() {
  clearTimeout(retryTimer);
  let principal;
  try {
    principal = await getJson(`${API}/whoami`);
  } catch (error) {
    if (error instanceof UnreachableError) retryTimer = setTimeout(start, POLL_INTERVAL_MS);
    else if (error instanceof ApiError && error.status === 401) leaveApp();
    else leaveApp(`Could not check the session: ${describeError(error)}`);
    return;
  }
  // Sent here to log in from a page (/docs) while already logged in (in another tab): go back at once.
  const target = returnTarget();
  if (target) {
    location.replace(target);
    return;
  }
  enterApp(principal);
}

window.addEventListener("hashchange", route);
start();

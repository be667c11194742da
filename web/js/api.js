// Talking to the coordinator's REST API, and keeping track of whether it can be reached and whether we are
// logged in. Requests carry the HttpOnly session cookie (same-origin); the page never sees a token.

export const API = "/api/v1";

/** The coordinator answered, but with an error status. */
export class ApiError extends Error {
  constructor(status, detail) {
    super(detail || `HTTP ${status}`);
    this.status = status;
    this.detail = detail;
  }
}

/** The coordinator could not be reached at all (network error or a proxy saying it is down). */
export class UnreachableError extends Error {}

const listeners = new Set();
const unauthenticatedListeners = new Set();
let reachable = true;

/** Calls listener(error) whenever the API answers 401: the session ended, expired or never began. */
export function onUnauthenticated(listener) {
  unauthenticatedListeners.add(listener);
  return () => unauthenticatedListeners.delete(listener);
}

/** Calls listener(reachable, error) whenever reachability changes. */
export function onReachabilityChange(listener) {
  listeners.add(listener);
  return () => listeners.delete(listener);
}

function setReachable(value, error = null) {
  if (value === reachable) return;
  reachable = value;
  for (const listener of listeners) listener(value, error);
}

async function errorDetail(response) {
  try {
    const body = await response.json();
    if (typeof body.detail === "string") return body.detail;
    return JSON.stringify(body.detail ?? body);
  } catch {
    return response.statusText;
  }
}

// A GET not answered in this long is given up as the coordinator being unreachable, so the login check and
// the pollers try again (every 2 s) instead of waiting on a stalled connection for ever: one such request
// once left a page blank, still checking who was logged in, for four minutes. Writes are never given up.
export const GET_TIMEOUT_MS = 30_000;

/** A signal that aborts when `signal` does (its reason kept) or after ms with a TimeoutError; done() ends it. */
function limited(signal, ms) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(new DOMException(`no answer in ${ms / 1000} s`, "TimeoutError")), ms);
  const forward = () => controller.abort(signal.reason);
  if (signal?.aborted) forward();
  else signal?.addEventListener("abort", forward, { once: true });
  return {
    signal: controller.signal,
    done() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", forward);
    },
  };
}

/** The coordinator cannot be reached (`message` says how it showed): tells the listeners, returns the error. */
function unreachable(message) {
  const error = new UnreachableError(message);
  setReachable(false, error);
  return error;
}

async function request(method, path, options = {}) {
  if (method !== "GET") return send(method, path, options);
  const limit = limited(options.signal, GET_TIMEOUT_MS);
  try {
    return await send(method, path, { ...options, signal: limit.signal });
  } catch (error) {
    throw error?.name === "TimeoutError" ? unreachable(`No answer in ${GET_TIMEOUT_MS / 1000} s`) : error;
  } finally {
    limit.done();
  }
}

async function send(method, path, { query = null, body = undefined, signal = undefined, loggingIn = false } = {}) {
  let url = path;
  if (query) {
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(query)) {
      if (value !== undefined && value !== null && value !== "") params.set(key, String(value));
    }
    const text = params.toString();
    if (text) url += `?${text}`;
  }
  // credentials "same-origin" sends the session cookie; fetch adds the Origin header the coordinator
  // checks on POST and DELETE.
  const init = { method, headers: { Accept: "application/json" }, signal, cache: "no-store", credentials: "same-origin" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (error) {
    if (error.name === "AbortError" || error.name === "TimeoutError") throw error;
    throw unreachable(`Network error (${error.message})`);
  }
  if (response.status === 502 || response.status === 503 || response.status === 504) {
    throw unreachable(`It answered HTTP ${response.status}`);
  }
  setReachable(true);
  if (!response.ok) {
    const error = new ApiError(response.status, await errorDetail(response));
    // A wrong token typed into the login form is that form's business, not a logged-out session.
    if (response.status === 401 && !loggingIn) for (const listener of unauthenticatedListeners) listener(error);
    throw error;
  }
  if (response.status === 204) return null;
  return response.json();
}

export const getJson = (path, options) => request("GET", path, options);
export const postJson = (path, body, options) => request("POST", path, { ...options, body });
export const deleteJson = (path, options) => request("DELETE", path, options);

/** Who is logged in ({user, role, token_name, via_session}); an ApiError with status 401 when nobody is. */
export const whoami = () => getJson(`${API}/whoami`);

/** Exchanges an API token for the session cookie; the token is sent once and never kept. */
export const logIn = (token) => postJson(`${API}/session`, { token }, { loggingIn: true });

/** Ends the session and clears its cookie. */
export const logOut = () => deleteJson(`${API}/session`, { loggingIn: true });

/** The path of an artifact's download, each segment of its path encoded. */
export function artifactUrl(jobId, path) {
  const encoded = String(path).split("/").map(encodeURIComponent).join("/");
  return `${API}/jobs/${encodeURIComponent(jobId)}/artifacts/${encoded}`;
}

/** What an error means for the user, in one sentence. */
export function describeError(error) {
  if (error instanceof UnreachableError) return "The coordinator cannot be reached; retrying.";
  if (error instanceof ApiError && error.status === 403) return `Not allowed: ${error.detail}`;
  if (error instanceof ApiError) return `The coordinator answered ${error.status}: ${error.detail}`;
  return String(error && error.message ? error.message : error);
}

// Talking to the coordinator's REST API, and keeping track of whether it can be reached.

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
let reachable = true;

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

async function request(method, path, { query = null, body = undefined, signal = undefined } = {}) {
  let url = path;
  if (query) {
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(query)) {
      if (value !== undefined && value !== null && value !== "") params.set(key, String(value));
    }
    const text = params.toString();
    if (text) url += `?${text}`;
  }
  const init = { method, headers: { Accept: "application/json" }, signal, cache: "no-store" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    const unreachable = new UnreachableError(`Network error (${error.message})`);
    setReachable(false, unreachable);
    throw unreachable;
  }
  if (response.status === 502 || response.status === 503 || response.status === 504) {
    const unreachable = new UnreachableError(`It answered HTTP ${response.status}`);
    setReachable(false, unreachable);
    throw unreachable;
  }
  setReachable(true);
  if (!response.ok) throw new ApiError(response.status, await errorDetail(response));
  if (response.status === 204) return null;
  return response.json();
}

export const getJson = (path, options) => request("GET", path, options);
export const postJson = (path, body, options) => request("POST", path, { ...options, body });

/** The path of an artifact's download, each segment of its path encoded. */
export function artifactUrl(jobId, path) {
  const encoded = String(path).split("/").map(encodeURIComponent).join("/");
  return `${API}/jobs/${encodeURIComponent(jobId)}/artifacts/${encoded}`;
}

/** What an error means for the user, in one sentence. */
export function describeError(error) {
  if (error instanceof UnreachableError) return "The coordinator cannot be reached; retrying.";
  if (error instanceof ApiError) return `The coordinator answered ${error.status}: ${error.detail}`;
  return String(error && error.message ? error.message : error);
}

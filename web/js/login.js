// The login form and the session part of the top bar (user, role, Log out).
// The pasted token goes to POST /api/v1/session once; the coordinator answers with an HttpOnly cookie and
// the field is cleared, so the token is kept neither in storage nor in the page. A page that sent the
// browser here to log in (/docs) is named in ?next= and opened again once logged in.

import { ApiError, describeError, logIn, logOut, UnreachableError } from "./api.js";

const ROLE_HINTS = {
  admin: "admin: everything, tokens and agents included",
  user: "user: submits jobs and cancels its own",
  viewer: "viewer: read-only",
};

/** Shows principal ({user, role}) in the top bar. */
export function showSessionHeader(principal) {
  document.getElementById("session-user").textContent = principal.user;
  const role = document.getElementById("session-role");
  role.textContent = principal.role;
  role.className = `badge role role-${principal.role}`;
  role.title = ROLE_HINTS[principal.role] || "";
}

// The coordinator words its refusals of a log-in for this page (server/api/login.py): what was wrong with
// the token and what to do here, not the CLI's options.
function loginFailure(error) {
  if (error instanceof ApiError && error.status === 401) {
    return `That token was not accepted: ${error.detail}`;
  }
  if (error instanceof ApiError && error.status === 422) return "Paste a token first.";
  if (error instanceof UnreachableError) return "The coordinator does not answer. Try again in a moment; if it persists, ask whoever runs it to check that it is up.";
  return describeError(error);
}

/**
 * The page to go back to after logging in: `?next=` as the coordinator sent it (server/api/login_redirect.py),
 * only when it is a path of this origin ("/docs"), never another site ("//evil.example", "https://..."):
 * no open redirect. Null when there is none.
 */
export function returnTarget(search = location.search) {
  const next = new URLSearchParams(search).get("next");
  if (!next || !next.startsWith("/") || next.startsWith("//") || next.startsWith("/\\") || next.length > 2048) return null;
  if (/[\u0000-\u001f\u007f\\]/.test(next)) return null;
  let url;
  try {
    url = new URL(next, location.origin);
  } catch {
    return null;
  }
  if (url.origin !== location.origin || url.pathname === "/") return null;
  return url.pathname + url.search + url.hash;
}

/**
 * Wires the login form and the Log out button. onLoggedIn(principal) runs after a successful log-in,
 * onLoggedOut() after logging out. Returns {show(message)}, which resets the form with an optional notice
 * (app.js shows or hides the form through body[data-auth]).
 */
export function mountLogin({ onLoggedIn, onLoggedOut }) {
  const form = document.getElementById("login-form");
  const input = document.getElementById("login-token");
  const error = document.getElementById("login-error");
  const submit = document.getElementById("login-submit");
  const logoutButton = document.getElementById("logout");
  const nextNote = document.getElementById("login-next");
  const target = returnTarget();
  if (target) {
    nextNote.textContent = `Log in to open ${target}.`;
    nextNote.hidden = false;
  }

  function showError(message) {
    error.textContent = message;
    error.hidden = !message;
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const token = input.value.trim();
    if (!token) {
      showError("Paste a token first.");
      input.focus();
      return;
    }
    submit.disabled = true;
    submit.textContent = "Logging in…";
    try {
      const principal = await logIn(token);
      input.value = "";
      showError("");
      if (target) {
        location.replace(target); // back to the page that sent here to log in
        return;
      }
      onLoggedIn(principal);
    } catch (err) {
      showError(loginFailure(err));
      input.select();
    } finally {
      submit.disabled = false;
      submit.textContent = "Log in";
    }
  });

  logoutButton.addEventListener("click", async () => {
    logoutButton.disabled = true;
    try {
      await logOut();
    } catch (err) {
      // A 401 means the session had already ended; anything else leaves it valid, so stay and say so.
      if (!(err instanceof ApiError && err.status === 401)) {
        logoutButton.disabled = false;
        logoutButton.textContent = "Log out (failed, retry)";
        logoutButton.title = describeError(err);
        return;
      }
    }
    logoutButton.disabled = false;
    logoutButton.textContent = "Log out";
    logoutButton.removeAttribute("title");
    onLoggedOut();
  });

  return {
    show(message) {
      input.value = "";
      showError(message);
      input.focus();
    },
  };
}

// The login form and the session part of the top bar (user, role, Log out).
// The pasted token goes to POST /api/v1/session once; the coordinator answers with an HttpOnly cookie and
// the field is cleared, so the token is kept neither in storage nor in the page.

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

function loginFailure(error) {
  if (error instanceof ApiError && error.status === 401) {
    return `That token was not accepted: ${error.detail}`;
  }
  if (error instanceof ApiError && error.status === 422) return "Paste a token first.";
  if (error instanceof UnreachableError) return "The coordinator cannot be reached; check that `mwms server` is running and try again.";
  return describeError(error);
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

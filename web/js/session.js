// Who is logged in, and what the UI offers them. The coordinator enforces every rule; this only hides
// buttons that would be refused, so a viewer is not shown a Cancel that always answers 403.

let current = null;

/** Records the logged-in caller ({user, role, ...} from /whoami or the login answer); null when logged out. */
export function setCurrentUser(principal) {
  current = principal ? { user: String(principal.user), role: String(principal.role) } : null;
}

/** {user, role} of the logged-in caller, or null. */
export function currentUser() {
  return current;
}

/** Whether the logged-in caller may cancel job: admins any job, users their own, viewers none. */
export function mayCancel(job) {
  if (!current || !job) return false;
  if (current.role === "admin") return true;
  return current.role === "user" && job.submitted_by === current.user;
}

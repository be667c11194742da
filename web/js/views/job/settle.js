// When the job page stops reading a job's metrics and artifacts on every poll.
//
// After a job ends its workers may still be stopping (a cancelled TensorFlow job trains on until SIGKILL),
// and their last reports and the chief's uploads land after the final state change. Metrics and artifacts
// are refreshed on every poll until the job has settled (every task ended and the charts reached the
// step the job reports), then a few more times, then every tenth poll.

import { isTerminal } from "../../format.js";

const POLLS_AFTER_SETTLED = 3;
const SLOW_POLL_EVERY = 10;
const TERMINAL_TASK_STATES = new Set(["SUCCEEDED", "FAILED", "STOPPED", "REJECTED", "LOST"]);

/** The highest step the charts hold of the newest attempt, per-step series only (what the job's `step`
 * counts: server/services/observing/telemetry.py progress_columns); null with none. */
export function chartedStep(points) {
  return points.reduce((charted, point) => chartedAfter(charted, point), { attempt: 0, step: null }).step;
}

/** chartedStep's state after one more point: the newest attempt seen and its latest per-step step. */
export function chartedAfter(charted, point) {
  if (point.name.startsWith("epoch_") || point.attempt < charted.attempt) return charted;
  if (point.attempt > charted.attempt || charted.step === null) return { attempt: point.attempt, step: point.step };
  return { attempt: charted.attempt, step: Math.max(charted.step, point.step) };
}

/** Whether an ended job has nothing more to show: every task ended and the charts hold its last step. */
export function settled(job, charted) {
  if (!isTerminal(job.state)) return false;
  if ((job.tasks || []).some((task) => !TERMINAL_TASK_STATES.has(task.state))) return false;
  return job.step === null || job.step === undefined || (charted !== null && charted >= job.step);
}

/** Counts the polls since the job settled; due(job, charted) says whether this poll reads the slow parts
 * (metrics, artifacts, devices, preflight): every poll until settled, a few after, then every tenth. */
export function settleGate() {
  let pollsSinceSettled = 0;
  return {
    due(job, charted) {
      pollsSinceSettled = settled(job, charted) ? pollsSinceSettled + 1 : 0;
      return pollsSinceSettled <= POLLS_AFTER_SETTLED || pollsSinceSettled % SLOW_POLL_EVERY === 0;
    },
  };
}

// The job page's Logs panel: a LogViewer (../../logs.js), made once the job's name is known.

import { h, panel, replaceChildren } from "../../dom.js";
import { LogViewer } from "../../logs.js";

/** The panel of job jobId: {element, refresh(job), showTask(index), dispose()}. */
export function logsPanel(jobId) {
  const body = h("div");
  const element = panel("Logs", body, { id: "logs" });
  let logs = null;

  function refresh(job) {
    if (!logs) {
      logs = new LogViewer(jobId, job.name);
      replaceChildren(body, logs.element);
    }
    logs.setTaskCount(job.workers);
  }

  /** Shows task index's logs and scrolls the panel into view (a task row's Logs button). */
  function showTask(index) {
    logs.selectTask(index);
    document.getElementById("logs").scrollIntoView({ behavior: "smooth" });
  }

  return {
    element,
    refresh,
    showTask,
    dispose() {
      if (logs) logs.dispose();
    },
  };
}

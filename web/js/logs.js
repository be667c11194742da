// The log viewer of one job: pick a task, follow its output live, filter by text, download what is loaded.

import { API, getJson, describeError, UnreachableError } from "./api.js";
import { h, replaceChildren } from "./dom.js";
import { formatTime } from "./format.js";
import { startPolling } from "./poll.js";

const TAIL = 500;
// Lines kept in the page; older ones are dropped so a chatty job cannot exhaust the browser's memory.
const MAX_LINES = 20000;

export class LogViewer {
  constructor(jobId, jobName) {
    this.jobId = jobId;
    this.jobName = jobName || jobId;
    this.task = 0;
    this.taskCount = 0;
    this.lines = [];
    this.nextAfter = 0;
    this.loadedOnce = false;
    this.query = "";

    this.taskSelect = h("select", { class: "select", "aria-label": "Task", dataset: { testid: "log-task" } });
    this.taskSelect.addEventListener("change", () => this.selectTask(Number(this.taskSelect.value)));
    this.follow = h("input", { type: "checkbox", checked: true, dataset: { testid: "log-follow" } });
    this.follow.addEventListener("change", () => {
      if (this.follow.checked) {
        this.poller.now();
        this.scrollToEnd();
      }
    });
    this.search = h("input", {
      type: "search",
      class: "input",
      placeholder: "Filter lines…",
      "aria-label": "Filter log lines",
      dataset: { testid: "log-search" },
    });
    this.search.addEventListener("input", () => {
      this.query = this.search.value.toLowerCase();
      this.applyFilter();
    });
    this.status = h("span", { class: "muted small log-status", "aria-live": "polite" });
    this.download = h("button", { type: "button", class: "button small", dataset: { testid: "log-download" } }, "Download .txt");
    this.download.addEventListener("click", () => this.downloadText());
    this.view = h("div", { class: "log-view", role: "log", tabindex: "0", dataset: { testid: "log-view", lines: "0" } });
    this.error = h("p", { class: "inline-error", hidden: true });

    this.element = h(
      "div",
      { class: "logs" },
      h(
        "div",
        { class: "log-toolbar" },
        h("label", { class: "field" }, h("span", { class: "field-label" }, "Task"), this.taskSelect),
        h("label", { class: "toggle" }, this.follow, h("span", null, "Follow")),
        h("label", { class: "field grow" }, this.search),
        this.download,
      ),
      this.error,
      this.view,
      h("div", { class: "log-foot" }, this.status),
    );
    this.poller = startPolling(() => this.poll(), { onError: (err) => this.showError(err) });
  }

  dispose() {
    this.poller.stop();
  }

  /** Sets how many tasks the job has (its worker count), offering each in the task picker. */
  setTaskCount(count) {
    if (count === this.taskCount) return;
    this.taskCount = count;
    replaceChildren(
      this.taskSelect,
      Array.from({ length: count }, (_, index) => h("option", { value: String(index), selected: index === this.task }, `task ${index}${index === 0 ? " (chief)" : ""}`)),
    );
  }

  selectTask(index) {
    if (index === this.task && this.loadedOnce) return;
    this.task = index;
    this.taskSelect.value = String(index);
    this.lines = [];
    this.nextAfter = 0;
    this.loadedOnce = false;
    this.view.replaceChildren();
    this.view.dataset.lines = "0";
    this.poller.now();
  }

  showError(err) {
    if (err instanceof UnreachableError) return;
    this.error.textContent = `Could not load logs: ${describeError(err)}`;
    this.error.hidden = false;
  }

  async poll() {
    if (this.loadedOnce && !this.follow.checked) return;
    const task = this.task;
    const page = await getJson(`${API}/jobs/${encodeURIComponent(this.jobId)}/logs`, {
      query: { task, after: this.nextAfter, tail: TAIL },
    });
    if (task !== this.task) return; // the user picked another task meanwhile
    this.error.hidden = true;
    this.loadedOnce = true;
    this.nextAfter = page.next_after ?? this.nextAfter;
    this.append(page.lines || []);
  }

  isNearEnd() {
    return this.view.scrollHeight - this.view.scrollTop - this.view.clientHeight < 40;
  }

  scrollToEnd() {
    this.view.scrollTop = this.view.scrollHeight;
  }

  append(newLines) {
    const stick = this.follow.checked && (this.isNearEnd() || this.lines.length === 0);
    const fragment = document.createDocumentFragment();
    let previous = this.lines.at(-1);
    for (const line of newLines) {
      if (line.redraw && this.redraw(line)) continue;
      if (!previous || previous.attempt !== line.attempt) {
        fragment.append(h("div", { class: "log-attempt" }, `attempt ${line.attempt}`));
      }
      const element = h(
        "div",
        { class: ["log-line", line.stream === "stderr" ? "stderr" : null], title: formatTime(line.at) },
        h("span", { class: "log-seq" }, String(line.seq)),
        h("span", { class: "log-text" }, stripTerminalCodes(line.text)),
      );
      element.hidden = !this.matches(line);
      line.element = element;
      this.lines.push(line);
      fragment.append(element);
      previous = line;
    }
    this.view.append(fragment);
    if (this.lines.length > MAX_LINES) {
      const dropped = this.lines.splice(0, this.lines.length - MAX_LINES);
      for (const line of dropped) line.element.remove();
    }
    this.view.dataset.lines = String(this.lines.length);
    this.updateStatus();
    if (!this.lines.length) {
      if (!this.view.querySelector(".log-empty")) {
        this.view.append(h("p", { class: "log-empty" }, `No output from task ${this.task} yet. Lines appear here as the task prints them.`));
      }
    } else {
      this.view.querySelector(".log-empty")?.remove();
    }
    if (stick) this.scrollToEnd();
  }

  /**
   * A redraw (a progress bar's `\r`) is a newer state of the line before it of the same stream: that line
   * takes its text in place. False when the page holds no such line (the new state is then a line of its own).
   */
  redraw(line) {
    for (let index = this.lines.length - 1; index >= 0; index -= 1) {
      const shown = this.lines[index];
      if (shown.attempt !== line.attempt) return false;
      if (shown.stream !== line.stream) continue;
      const element = shown.element;
      element.title = formatTime(line.at);
      element.querySelector(".log-seq").textContent = String(line.seq);
      element.querySelector(".log-text").textContent = stripTerminalCodes(line.text);
      element.hidden = !this.matches(line);
      line.element = element;
      this.lines[index] = line;
      return true;
    }
    return false;
  }

  matches(line) {
    return !this.query || line.text.toLowerCase().includes(this.query);
  }

  applyFilter() {
    for (const line of this.lines) line.element.hidden = !this.matches(line);
    for (const divider of this.view.querySelectorAll(".log-attempt")) divider.hidden = Boolean(this.query);
    this.updateStatus();
  }

  updateStatus() {
    const total = this.lines.length;
    const shown = this.query ? this.lines.filter((line) => !line.element.hidden).length : total;
    this.view.dataset.shown = String(shown);
    this.status.textContent = this.query ? `${shown} of ${total} lines match` : `${total} line${total === 1 ? "" : "s"} loaded`;
  }

  downloadText() {
    const text = this.lines.map((line) => line.text).join("\n") + (this.lines.length ? "\n" : "");
    const blob = new Blob([text], { type: "text/plain;charset=utf-8" });
    const url = URL.createObjectURL(blob);
    const safeName = String(this.jobName).replace(/[^\w.-]+/g, "_").slice(0, 80) || "job";
    const link = h("a", { href: url, download: `${safeName}-task${this.task}.txt`, hidden: true });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }
}

// Colour and cursor escape sequences that programs print for terminals; shown as text they are noise.
const TERMINAL_CODES = /\x1b\[[0-9;?]*[ -\/]*[@-~]/g;

export function stripTerminalCodes(text) {
  return text.replace(TERMINAL_CODES, "");
}

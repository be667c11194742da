// One helper for every periodic refresh: runs a task, waits, runs it again, until stopped.
// The next run is scheduled only after the previous one finished, so slow answers never pile up.

export const POLL_INTERVAL_MS = 2000;

/**
 * Starts polling task() every intervalMs. Returns {stop, now}: stop() ends it, now() runs it at once.
 * Errors are passed to onError and polling continues: a coordinator that comes back is picked up again.
 */
export function startPolling(task, { intervalMs = POLL_INTERVAL_MS, onError = null } = {}) {
  let stopped = false;
  let timer = null;
  let running = null;

  async function tick() {
    timer = null;
    if (stopped) return;
    running = (async () => {
      try {
        await task();
      } catch (error) {
        if (error && error.name === "AbortError") return;
        if (onError) onError(error);
        else console.warn("poll failed", error);
      }
    })();
    await running;
    running = null;
    if (!stopped) timer = setTimeout(tick, typeof intervalMs === "function" ? intervalMs() : intervalMs);
  }

  tick();
  return {
    stop() {
      stopped = true;
      if (timer) clearTimeout(timer);
    },
    async now() {
      if (stopped) return;
      if (running) await running;
      if (timer) {
        clearTimeout(timer);
        await tick();
      }
    },
  };
}

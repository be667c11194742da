// Building DOM safely: every piece of data becomes a text node or an attribute value, never markup.
// Nothing in the dashboard uses innerHTML, so a job name like <img onerror=...> is only ever shown as text.

const SVG_NS = "http://www.w3.org/2000/svg";

function applyProps(element, props) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") element.setAttribute("class", Array.isArray(value) ? value.filter(Boolean).join(" ") : value);
    else if (key === "text") element.textContent = String(value);
    else if (key === "dataset") Object.assign(element.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") element.addEventListener(key.slice(2), value);
    else if (value === true) element.setAttribute(key, "");
    else element.setAttribute(key, String(value));
  }
}

function appendChildren(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** An HTML element: h("a", {href: "#/jobs", class: "link"}, "Jobs"). Strings become text nodes. */
export function h(tag, props, ...children) {
  const element = document.createElement(tag);
  applyProps(element, props);
  appendChildren(element, children);
  return element;
}

/** An SVG element; same calling convention as h(). */
export function svg(tag, props, ...children) {
  const element = document.createElementNS(SVG_NS, tag);
  applyProps(element, props);
  appendChildren(element, children);
  return element;
}

/** Replaces all children of element with children. */
export function replaceChildren(element, ...children) {
  element.replaceChildren();
  appendChildren(element, children);
  return element;
}

/** A table inside a wrapper that scrolls sideways on narrow screens. */
export function table(columns, rows, props = {}) {
  const head = h("thead", null, h("tr", null, columns.map((c) => h("th", { scope: "col", class: c.class }, c.label))));
  const body = h("tbody", null, rows);
  return h("div", { class: "table-wrap" }, h("table", { class: ["table", props.class], ...props.attrs }, head, body));
}

/** A panel with a title bar (and optional tools on the right) around body. */
export function panel(title, body, { tools = null, id = null, className = null } = {}) {
  return h(
    "section",
    { class: ["panel", className], id, "aria-label": title },
    h("header", { class: "panel-head" }, h("h2", { class: "panel-title" }, title), tools ? h("div", { class: "panel-tools" }, tools) : null),
    h("div", { class: "panel-body" }, body),
  );
}

/** A message for an empty list that says what to do next, with an optional command to copy. */
export function emptyState(title, hint, command = null) {
  return h(
    "div",
    { class: "empty", dataset: { testid: "empty" } },
    h("p", { class: "empty-title" }, title),
    hint ? h("p", { class: "empty-hint" }, hint) : null,
    command ? h("pre", { class: "command" }, h("code", null, command)) : null,
  );
}

/** A coloured pill for a job, attempt or task state. */
export function stateBadge(state) {
  const name = String(state || "UNKNOWN");
  return h("span", { class: ["badge", `state-${name.toLowerCase()}`], dataset: { state: name } }, name);
}

/**
 * Text that may be long (a failure reason quoting log lines): its first line, cut at limit characters,
 * with the whole text behind a disclosure.
 */
export function clampedText(text, { limit = 160, className = null } = {}) {
  const value = String(text || "");
  const firstLine = value.split("\n", 1)[0];
  if (value.length <= limit && firstLine === value) return h("span", { class: className }, value);
  const short = firstLine.length > limit ? `${firstLine.slice(0, limit).trimEnd()}…` : `${firstLine}…`;
  return h(
    "details",
    { class: ["clamped", className] },
    h("summary", null, h("span", { class: "clamped-short" }, short), h("span", { class: "clamped-more" }, "more")),
    h("pre", { class: "clamped-full" }, value),
  );
}

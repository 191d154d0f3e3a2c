// Talking to the server: every call carries the API key the user entered (kept in
// sessionStorage, so it lasts as long as the tab), and every refusal becomes an Error whose
// message is the server's own.

const KEY = "peregrine.apiKey";

export function apiKey() {
  return sessionStorage.getItem(KEY) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

function headers(extra) {
  const h = new Headers(extra || {});
  const key = apiKey();
  if (key) h.set("Authorization", `Bearer ${key}`);
  return h;
}

/** The server's message from an error body: `/v1` sends {error: {code, message}}, KServe
 * routes {error: "..."}. */
async function failure(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    const e = body.error;
    if (typeof e === "string") message = e;
    else if (e && e.message) message = `${e.message} (${e.code})`;
  } catch (_) {
    // Not JSON: keep the status line.
  }
  if (response.status === 401) message += " — enter an API key above";
  const err = new Error(message);
  err.status = response.status;
  return err;
}

/** fetch with the key; throws the server's message unless the answer is a success. */
export async function call(path, options = {}) {
  const response = await fetch(path, { ...options, headers: headers(options.headers) });
  if (!response.ok) throw await failure(response);
  return response;
}

export async function getJson(path, options) {
  return (await call(path, options)).json();
}

export async function sendJson(method, path, body) {
  const response = await call(path, {
    method,
    headers: { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return response.status === 204 ? null : response.json();
}

/** An image the key may fetch, as an object URL for <img> (which cannot send headers). */
export async function imageUrl(path, signal) {
  const response = await call(path, { signal });
  return { url: URL.createObjectURL(await response.blob()), response };
}

/** Reads a Server-Sent Events feed through fetch, so that it carries the key (neither
 * EventSource nor a browser's WebSocket can send an Authorization header). Calls
 * `onEvent(name, data)` per event until `signal` aborts; reconnects after a drop. */
export async function sse(path, onEvent, signal) {
  while (!signal.aborted) {
    try {
      const response = await call(path, { signal, headers: { Accept: "text/event-stream" } });
      await readEvents(response.body.getReader(), onEvent);
    } catch (e) {
      if (signal.aborted) return;
      onEvent("error", e.message);
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
}

async function readEvents(reader, onEvent) {
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) onEvent(name, data.join("\n"));
    }
  }
}

/** Prometheus' text format as [{name, labels, value}]. */
export function parseMetrics(text) {
  const samples = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const l of (m[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    samples.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return samples;
}

/** Builds an element: el("td", {class: "x"}, "text", child). */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c !== undefined && c !== null) node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

/** A status badge: the stream's state word as text (not colour alone). */
export function badge(state, title) {
  return el("span", { class: `badge ${state}`, title }, state.replace("_", " "));
}

export function showError(target, e) {
  target.textContent = e ? e.message || String(e) : "";
}

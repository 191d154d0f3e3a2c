// Models: the repository (every model and version with its state and reason, which
// version serves, load and unload through the KServe v2 repository routes, which need the
// admin scope) and a health panel (readiness, draining, queue depth, P99 and rollouts per
// model, from /health/ready and /metrics).

import { apiKey, badge, call, el, getJson, parseMetrics, sendJson } from "./api.js";

const EVERY_MS = 3000;

/** /health/ready's body, whether it answers 200 (ready) or 503 (not). */
export async function readiness() {
  const headers = apiKey() ? { Authorization: `Bearer ${apiKey()}` } : {};
  const response = await fetch("/health/ready", { headers });
  if (response.status !== 200 && response.status !== 503) throw new Error(`readiness: ${response.status}`);
  return response.json();
}

function modelRow(entry, serving, act) {
  const name = entry.name;
  const button = (label, action) => {
    const b = el("button", { type: "button", class: "secondary", "aria-label": `${label} ${name}` }, label);
    b.addEventListener("click", () => act(name, action, b));
    return b;
  };
  const state = entry.state || "UNAVAILABLE";
  const serves = serving && entry.version !== undefined && serving === entry.version;
  return el("tr", { "data-model": name },
    el("th", { scope: "row" }, name), el("td", {}, entry.version ?? "–"),
    el("td", {}, badge(state), entry.reason ? el("div", { class: "error" }, entry.reason) : null),
    el("td", {}, serves ? "serving" : ""),
    el("td", {}, entry.sha256 ? el("code", { title: entry.sha256 }, entry.sha256.slice(0, 12)) : ""),
    el("td", {}, button("Load", "load"), " ", button("Unload", "unload")));
}

function figures(metrics, model) {
  const pick = (name) => metrics.filter((s) => s.name === name && s.labels.model === model);
  const queue = pick("peregrine_queue_depth").reduce((a, s) => a + s.value, 0);
  const p99 = pick("peregrine_latency_p99_seconds").map((s) => `v${s.labels.version}: ${(s.value * 1000).toFixed(1)} ms`);
  const inflight = pick("peregrine_in_flight_requests").reduce((a, s) => a + s.value, 0);
  const rollouts = pick("peregrine_rollouts_total").map((s) => `${s.labels.outcome} ${s.value}`);
  return { queue, p99: p99.join(", ") || "–", inflight, rollouts: rollouts.join(", ") || "none" };
}

function healthPanel(ready, metrics) {
  const rows = ready.models.map((m) => {
    const f = figures(metrics, m.name);
    return el("tr", { "data-model": m.name },
      el("th", { scope: "row" }, m.name),
      el("td", {}, badge(m.ready ? "ready" : "not-ready", m.reason), m.reason ? el("div", { class: "error" }, m.reason) : null),
      el("td", {}, m.version ?? "–"), el("td", {}, f.queue), el("td", {}, f.inflight), el("td", {}, f.p99),
      el("td", {}, f.rollouts));
  });
  const head = ["Model", "Ready", "Serving version", "Queue depth", "In flight", "P99", "Rollouts"];
  return [
    el("p", { id: "server-health" }, "Server: ", badge(ready.ready ? "ready" : "not-ready"),
      ready.draining ? " draining" : " not draining"),
    el("div", { class: "table-wrap" }, el("table", { "aria-label": "Model health" },
      el("thead", {}, el("tr", {}, head.map((h) => el("th", { scope: "col" }, h)))), el("tbody", {}, rows))),
  ];
}

export function mount(main) {
  const error = el("p", { class: "error", role: "alert" });
  const repoError = el("p", { class: "error" });
  const health = el("section", { class: "panel", "aria-labelledby": "health-title" });
  const repoBody = el("tbody");
  const head = ["Model", "Version", "State", "Serves", "SHA-256", "Actions"];
  main.append(el("h1", {}, "Models"), error,
    el("h2", { id: "health-title" }, "Health"), health,
    el("h2", {}, "Repository"), repoError,
    el("div", { class: "table-wrap" }, el("table", { "aria-label": "Model repository" },
      el("thead", {}, el("tr", {}, head.map((h) => el("th", { scope: "col" }, h)))), repoBody)));
  let timer = null;
  let left = false;

  async function act(name, action, button) {
    button.disabled = true;
    error.textContent = "";
    try {
      await sendJson("POST", `/v2/repository/models/${encodeURIComponent(name)}/${action}`, {});
    } catch (e) {
      error.textContent = `${action} ${name}: ${e.message}`;
    }
    await refresh();
  }

  async function refresh() {
    clearTimeout(timer);
    let ready = { models: [] };
    try {
      ready = await readiness();
      const metrics = parseMetrics(await (await call("/metrics")).text());
      health.replaceChildren(...healthPanel(ready, metrics));
    } catch (e) {
      error.textContent = e.message;
    }
    try {
      const index = await sendJson("POST", "/v2/repository/index", {});
      const serving = new Map(ready.models.map((m) => [m.name, m.version]));
      repoBody.replaceChildren(...index.map((e) => modelRow(e, serving.get(e.name), act)));
      repoError.textContent = "";
    } catch (e) {
      // The repository needs the admin scope; health above still shows.
      repoError.textContent = e.message;
    }
    if (!left) timer = setTimeout(refresh, EVERY_MS);
  }
  refresh();
  return () => {
    left = true;
    clearTimeout(timer);
  };
}

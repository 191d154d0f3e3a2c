// Streams: the list (state, source, remove), the form that adds one (POST /v1/streams,
// the config file's [[streams]] fields; the server's own message when it refuses), and
// #/streams/NAME, the zone and line editor (zones.js).

import { badge, el, getJson, sendJson } from "./api.js";
import * as zones from "./zones.js";

/** A control with its label beside it (not around it: a select's options would become
 * part of its name) and an optional hint, which is also its description. */
function field(label, input, hint) {
  const hintNode = hint ? el("span", { class: "muted", id: `${input.id}-hint` }, hint) : null;
  if (hintNode) input.setAttribute("aria-describedby", hintNode.id);
  return el("div", { class: "field" }, el("label", { for: input.id }, label), input, hintNode);
}

function addForm(onAdded) {
  const name = el("input", { id: "add-name", name: "name", required: true, pattern: "[A-Za-z0-9_.\\-]+", autocomplete: "off" });
  const url = el("input", { id: "add-url", name: "url", required: true, placeholder: "rtsp://camera/stream", autocomplete: "off" });
  const transport = el("select", { id: "add-transport", name: "transport" },
    el("option", { value: "tcp" }, "TCP"), el("option", { value: "udp" }, "UDP"));
  const fps = el("input", { id: "add-fps", name: "fps", type: "number", min: "0.1", step: "any", placeholder: "every frame" });
  const looped = el("input", { name: "loop", type: "checkbox" });
  const realtime = el("input", { name: "realtime", type: "checkbox", checked: true });
  const tracking = el("input", { name: "tracking", type: "checkbox", checked: true });
  const snapshots = el("input", { name: "snapshots", type: "checkbox", checked: true });
  const error = el("p", { class: "error", role: "alert", id: "add-error" });
  const submit = el("button", { type: "submit" }, "Add stream");
  const form = el("form", { class: "panel", "aria-labelledby": "add-title", "aria-describedby": "add-error" },
    el("h2", { id: "add-title" }, "Add a stream"),
    el("div", { class: "form" },
      field("Name", name), field("URL", url, "rtsp://…, or an mp4 file where the server allows files"),
      field("Transport (RTSP)", transport), field("Frames per second", fps),
      el("label", { class: "check" }, looped, "Loop (files)"),
      el("label", { class: "check" }, realtime, "Real time (files)"),
      el("label", { class: "check" }, tracking, "Track objects"),
      el("label", { class: "check" }, snapshots, "Event snapshots"),
      el("div", {}, submit)),
    error);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    error.textContent = "";
    const body = {
      name: name.value.trim(), url: url.value.trim(), transport: transport.value,
      loop: looped.checked, realtime: realtime.checked,
      analytics: { tracking: tracking.checked, snapshots: snapshots.checked },
    };
    if (fps.value) body.fps = Number(fps.value);
    submit.disabled = true;
    try {
      await sendJson("POST", "/v1/streams", body);
      form.reset();
      await onAdded(body.name);
    } catch (err) {
      error.textContent = err.message;
    } finally {
      submit.disabled = false;
    }
  });
  return form;
}

function row(s, onRemove) {
  const why = s.status.last_error || s.status.reason || "";
  const q = encodeURIComponent(s.name);
  const remove = el("button", { type: "button", class: "secondary", "aria-label": `Remove ${s.name}` }, "Remove");
  remove.addEventListener("click", () => onRemove(s.name, remove));
  return el("tr", { "data-stream": s.name },
    el("th", { scope: "row" }, el("a", { href: `#/live/${q}` }, s.name)),
    el("td", {}, badge(s.status.state, why), why ? el("div", { class: "error" }, why) : null),
    el("td", {}, el("code", {}, s.source)),
    el("td", {}, el("a", { href: `#/streams/${q}` }, "Zones and lines"), " ", remove));
}

function mountList(main) {
  const error = el("p", { class: "error", role: "alert" });
  const body = el("tbody");
  const table = el("div", { class: "table-wrap" }, el("table", { "aria-label": "Streams" },
    el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "Name"), el("th", { scope: "col" }, "State"),
      el("th", { scope: "col" }, "Source"), el("th", { scope: "col" }, "Actions"))), body));
  let timer = null;
  let left = false;

  async function refresh() {
    clearTimeout(timer);
    try {
      const { streams } = await getJson("/v1/streams");
      body.replaceChildren(...streams.map((s) => row(s, remove)));
      if (!streams.length) body.append(el("tr", {}, el("td", { colspan: 4, class: "muted" }, "No streams.")));
      error.textContent = "";
    } catch (e) {
      error.textContent = e.message;
    }
    if (!left) timer = setTimeout(refresh, 3000);
  }

  async function remove(name, button) {
    if (!confirm(`Remove stream ${name}?`)) return;
    button.disabled = true;
    try {
      await sendJson("DELETE", `/v1/streams/${encodeURIComponent(name)}`);
    } catch (e) {
      error.textContent = e.message;
    }
    await refresh();
  }

  main.append(el("h1", {}, "Streams"), error, table, addForm(refresh));
  refresh();
  return () => {
    left = true;
    clearTimeout(timer);
  };
}

export function mount(main, name) {
  return name ? zones.mount(main, name) : mountList(main);
}

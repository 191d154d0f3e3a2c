// Events: the event store queried by stream, label, zone, type and time (GET /v1/events),
// newest first, a page at a time (the server's cursor), with snapshot thumbnails; and one
// event in full (#/events/ID).

import { el, getJson, imageUrl } from "./api.js";

const TYPES = ["", "object.start", "object.end", "zone.enter", "zone.exit", "zone.loiter", "line.cross"];
const PAGE = 25;

function input(id, label, attrs = {}) {
  const node = el("input", { id, name: id, autocomplete: "off", ...attrs });
  return { node, wrap: el("label", { for: id }, label, node) };
}

/** datetime-local (the browser's local time) as unix milliseconds. */
function ms(value) {
  return value ? String(new Date(value).getTime()) : "";
}

class Thumbnails {
  constructor() {
    this.urls = [];
    this.abort = new AbortController();
  }

  async fill(img, id) {
    try {
      const { url } = await imageUrl(`/v1/events/${encodeURIComponent(id)}/snapshot.jpg`, this.abort.signal);
      this.urls.push(url);
      img.src = url;
    } catch (_) {
      img.replaceWith(el("span", { class: "muted" }, "no snapshot"));
    }
  }

  clear() {
    this.abort.abort();
    this.abort = new AbortController();
    for (const u of this.urls) URL.revokeObjectURL(u);
    this.urls = [];
  }
}

function where(e) {
  if (e.zone) return `zone ${e.zone}`;
  if (e.line) return `line ${e.line} (${e.direction})`;
  return "";
}

function row(e, thumbs) {
  const time = new Date(e.capture_unix_ms);
  const link = el("a", { href: `#/events/${encodeURIComponent(e.id)}` }, time.toLocaleString());
  let picture = el("span", { class: "muted" }, "–");
  if (e.snapshot_url) {
    picture = el("img", { class: "thumb", alt: `${e.label} in ${e.stream}`, width: 96, height: 54 });
    thumbs.fill(picture, e.id);
  }
  return el("tr", { "data-type": e.type },
    el("td", {}, picture), el("td", {}, link), el("td", {}, e.type), el("td", {}, e.stream),
    el("td", {}, e.label ?? ""), el("td", {}, e.track_id ?? ""), el("td", {}, where(e)),
    el("td", {}, e.score !== undefined ? e.score.toFixed(2) : ""));
}

function filters(onQuery) {
  const stream = input("ev-stream", "Stream");
  const label = input("ev-label", "Label", { placeholder: "person" });
  const zone = input("ev-zone", "Zone");
  const type = el("select", { id: "ev-type", name: "type" }, TYPES.map((t) => el("option", { value: t }, t || "any")));
  const after = input("ev-after", "From", { type: "datetime-local" });
  const before = input("ev-before", "Until", { type: "datetime-local" });
  const form = el("form", { class: "panel form", "aria-label": "Event filters" },
    stream.wrap, label.wrap, zone.wrap, el("div", { class: "field" }, el("label", { for: "ev-type" }, "Type"), type), after.wrap, before.wrap,
    el("div", {}, el("button", { type: "submit" }, "Search")));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const q = new URLSearchParams({ limit: String(PAGE) });
    const put = (k, v) => { if (v) q.set(k, v); };
    put("stream", stream.node.value.trim());
    put("label", label.node.value.trim());
    put("zone", zone.node.value.trim());
    put("type", type.value);
    put("after", ms(after.node.value));
    put("before", ms(before.node.value));
    onQuery(q);
  });
  return form;
}

function mountList(main) {
  const thumbs = new Thumbnails();
  const error = el("p", { class: "error", role: "alert" });
  const status = el("p", { class: "muted", "aria-live": "polite" });
  const body = el("tbody");
  const next = el("button", { type: "button", class: "secondary", disabled: true }, "Older events");
  const first = el("button", { type: "button", class: "secondary", disabled: true }, "Newest");
  let query = new URLSearchParams({ limit: String(PAGE) });
  let cursor = null;
  let pageNo = 1;

  async function load(q, c) {
    error.textContent = "";
    const params = new URLSearchParams(q);
    if (c) params.set("cursor", c);
    try {
      const page = await getJson(`/v1/events?${params}`);
      thumbs.clear();
      body.replaceChildren(...page.events.map((e) => row(e, thumbs)));
      cursor = page.next_cursor;
      next.disabled = !cursor;
      first.disabled = !c;
      status.textContent = page.events.length ? `Page ${pageNo}: ${page.events.length} events` : "No events match.";
    } catch (e) {
      error.textContent = e.message;
    }
  }
  next.addEventListener("click", () => { pageNo += 1; load(query, cursor); });
  first.addEventListener("click", () => { pageNo = 1; load(query, null); });
  const head = ["Snapshot", "Time", "Type", "Stream", "Label", "Track", "Where", "Score"];
  main.append(el("h1", {}, "Events"), filters((q) => { query = q; pageNo = 1; load(q, null); }), error, status,
    el("div", { class: "table-wrap" }, el("table", { "aria-label": "Events" },
      el("thead", {}, el("tr", {}, head.map((h) => el("th", { scope: "col" }, h)))), body)),
    el("div", { class: "toolbar" }, first, next));
  load(query, null);
  return () => thumbs.clear();
}

function mountDetail(main, id) {
  const thumbs = new Thumbnails();
  const error = el("p", { class: "error", role: "alert" });
  const picture = el("div");
  const json = el("pre", { tabindex: 0, "aria-label": "Event JSON" });
  main.append(el("p", {}, el("a", { href: "#/events" }, "← Events")), el("h1", {}, "Event"), error,
    el("div", { class: "split" }, el("section", { class: "panel" }, picture), el("section", {}, json)));
  getJson(`/v1/events/${encodeURIComponent(id)}`).then((e) => {
    json.textContent = JSON.stringify(e, null, 2);
    main.querySelector("h1").textContent = `${e.type} · ${e.label ?? ""} · ${e.stream}`;
    if (e.snapshot_url) {
      const img = el("img", { alt: `Snapshot of ${e.label} in ${e.stream}`, class: "snapshot" });
      picture.append(img);
      thumbs.fill(img, e.id);
    } else {
      picture.append(el("p", { class: "muted" }, "No snapshot."));
    }
  }).catch((e) => { error.textContent = e.message; });
  return () => thumbs.clear();
}

export function mount(main, id) {
  return id ? mountDetail(main, id) : mountList(main);
}

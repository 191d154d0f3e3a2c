// Live: every stream's newest picture with the boxes of that very frame, its state, fps
// and drops; one stream large (#/live/NAME) with its zones, lines and recent events.
//
// Pictures come from .../latest.jpg, whose `x-frame-seq` header names the frame; boxes
// come from the detection feed (the wire schema's `seq`), kept per stream for the last
// few frames. A picture is drawn with the boxes of its own seq, never of a neighbour.

import { badge, call, el, getJson, sse } from "./api.js";
import { drawDetections, drawPicture, drawPlaces } from "./draw.js";

const KEPT_FRAMES = 120;
const PICTURE_EVERY_MS = 200;
const STATUS_EVERY_MS = 2000;

/** One stream's picture on a canvas, redrawn as new frames come. */
class StreamView {
  constructor(name, canvas, { places = false } = {}) {
    this.name = name;
    this.canvas = canvas;
    this.places = places ? { zones: [], lines: [] } : null;
    this.frames = new Map(); // seq -> detection event
    this.stopped = false;
    this.abort = new AbortController();
  }

  observe(event) {
    this.frames.set(event.seq, event);
    if (this.frames.size > KEPT_FRAMES) this.frames.delete(this.frames.keys().next().value);
  }

  /** The detection event of frame `seq`, waiting briefly if the feed is behind. */
  async eventOf(seq) {
    for (let i = 0; i < 10 && !this.frames.has(seq) && !this.stopped; i++) {
      await sleep(50);
    }
    return this.frames.get(seq);
  }

  async run() {
    while (!this.stopped) {
      try {
        await this.drawOnce();
      } catch (e) {
        if (this.stopped) return;
        this.canvas.dataset.error = e.message;
        this.canvas.setAttribute("aria-label", `${this.name}: ${e.message}`);
      }
      await sleep(PICTURE_EVERY_MS);
    }
  }

  async drawOnce() {
    const path = `/v1/streams/${encodeURIComponent(this.name)}/latest.jpg`;
    const response = await call(path, { signal: this.abort.signal });
    const seq = Number(response.headers.get("x-frame-seq"));
    if (seq === this.shownSeq) return;
    const url = URL.createObjectURL(await response.blob());
    try {
      const image = await loadImage(url);
      const event = await this.eventOf(seq);
      if (this.stopped) return;
      const ctx = drawPicture(this.canvas, image);
      if (this.places) drawPlaces(ctx, this.places, event);
      const detections = event ? event.detections : [];
      if (event) drawDetections(ctx, detections, event);
      this.shownSeq = seq;
      // Read by the browser tests and by assistive technology alike.
      this.canvas.dataset.seq = String(seq);
      this.canvas.dataset.boxes = event ? String(detections.length) : "";
      delete this.canvas.dataset.error;
      this.canvas.setAttribute("aria-label", describe(this.name, event));
    } finally {
      URL.revokeObjectURL(url);
    }
  }

  stop() {
    this.stopped = true;
    this.abort.abort();
  }
}

function describe(name, event) {
  if (!event) return `${name}: picture, detections not yet known`;
  const labels = event.detections.map((d) => d.class_name);
  return `${name}: ${labels.length} detections${labels.length ? ": " + labels.join(", ") : ""}`;
}

function loadImage(url) {
  return new Promise((resolve, reject) => {
    const image = new Image();
    image.onload = () => resolve(image);
    image.onerror = () => reject(new Error("the picture could not be decoded"));
    image.src = url;
  });
}

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

/** State, fps and drops from the stream's counters, fps from two readings. */
class StreamFigures {
  constructor(node) {
    this.node = node;
    this.last = null;
  }

  update(report) {
    const c = report.counters;
    const now = performance.now();
    let fps = "–";
    if (this.last) {
      const dt = (now - this.last.at) / 1000;
      fps = ((c.frames_detected - this.last.detected) / dt).toFixed(1);
    }
    this.last = { at: now, detected: c.frames_detected };
    const drops = Object.values(c.frames_dropped).reduce((a, b) => a + b, 0);
    const s = report.status;
    const why = s.last_error || s.reason || "";
    const parts = [badge(s.state, why), el("span", {}, `${fps} fps`), el("span", {}, `${drops} dropped`),
      el("span", {}, `${c.reconnects} reconnects`)];
    if (why) parts.push(el("span", { class: "error" }, why));
    this.node.replaceChildren(...parts);
  }
}

function tile(name) {
  const canvas = el("canvas", { role: "img", "aria-label": `${name}: waiting for a picture` });
  const figures = el("div", { class: "stats", "aria-live": "polite" });
  const link = el("a", { href: `#/live/${encodeURIComponent(name)}` }, name);
  const node = el("article", { class: "panel tile", "data-stream": name },
    el("h2", {}, link), el("div", { class: "frame" }, canvas), figures);
  // The whole tile opens the large view; the link inside is the keyboard's way.
  node.addEventListener("click", (e) => { if (e.target !== link) link.click(); });
  return { node, canvas, figures: new StreamFigures(figures) };
}

function feedInto(views, path, signal) {
  sse(path, (kind, data) => {
    if (kind !== "detection") return;
    const event = JSON.parse(data);
    const view = views.get(event.stream);
    if (view && event.detections) view.observe(event);
  }, signal);
}

function mountGrid(main) {
  const grid = el("div", { class: "grid" });
  const message = el("p", { class: "muted" }, "Loading streams…");
  main.append(el("h1", {}, "Live"), message, grid);
  const views = new Map();
  const tiles = new Map();
  const abort = new AbortController();
  feedInto(views, "/v1/streams/events", abort.signal);

  async function refresh() {
    const { streams } = await getJson("/v1/streams");
    message.textContent = streams.length ? "" : "No streams yet: add one on the Streams page.";
    for (const s of streams) {
      if (tiles.has(s.name)) continue;
      const t = tile(s.name);
      tiles.set(s.name, t);
      grid.append(t.node);
      const view = new StreamView(s.name, t.canvas);
      views.set(s.name, view);
      view.run();
    }
    for (const [name, t] of tiles) {
      if (!streams.some((s) => s.name === name)) {
        views.get(name).stop();
        views.delete(name);
        tiles.delete(name);
        t.node.remove();
      }
    }
    await Promise.all([...tiles].map(async ([name, t]) => {
      t.figures.update(await getJson(`/v1/streams/${encodeURIComponent(name)}`));
    }));
  }
  return poll(refresh, STATUS_EVERY_MS, message, () => {
    abort.abort();
    for (const v of views.values()) v.stop();
  });
}

/** Runs `f` now and every `ms` until left; failures show in `message`. */
function poll(f, ms, message, onLeave) {
  let timer = null;
  let left = false;
  const tick = async () => {
    try {
      await f();
    } catch (e) {
      message.textContent = e.message;
      message.className = "error";
    }
    if (!left) timer = setTimeout(tick, ms);
  };
  tick();
  return () => {
    left = true;
    clearTimeout(timer);
    if (onLeave) onLeave();
  };
}

function timelineItem(e) {
  const where = e.zone ? ` zone ${e.zone}` : e.line ? ` line ${e.line} ${e.direction}` : "";
  const time = new Date(e.capture_unix_ms).toLocaleTimeString();
  return el("li", {},
    el("a", { href: `#/events/${encodeURIComponent(e.id)}` },
      `${time} ${e.type} ${e.label ?? ""} #${e.track_id ?? "–"}${where}`));
}

function mountLarge(main, name) {
  const canvas = el("canvas", { role: "img", "aria-label": `${name}: waiting for a picture` });
  const figures = el("div", { class: "stats", "aria-live": "polite" });
  const timeline = el("ol", { class: "timeline", "aria-label": "Recent events" });
  const message = el("p", { class: "muted" });
  main.append(
    el("p", {}, el("a", { href: "#/live" }, "← All streams")),
    el("h1", {}, name),
    el("div", { class: "split" },
      el("section", { class: "panel", "data-stream": name },
        el("div", { class: "frame" }, canvas), figures,
        el("p", {}, el("a", { href: `#/streams/${encodeURIComponent(name)}` }, "Edit zones and lines"))),
      el("section", { class: "panel" }, el("h2", {}, "Recent events"), message, timeline)));
  const view = new StreamView(name, canvas, { places: true });
  const stats = new StreamFigures(figures);
  const abort = new AbortController();
  feedInto(new Map([[name, view]]), `/v1/streams/${encodeURIComponent(name)}/events`, abort.signal);
  view.run();
  const q = encodeURIComponent(name);
  return poll(async () => {
    stats.update(await getJson(`/v1/streams/${q}`));
    view.places = await getJson(`/v1/streams/${q}/zones`);
    try {
      const page = await getJson(`/v1/events?stream=${q}&limit=20`);
      timeline.replaceChildren(...page.events.map(timelineItem));
      message.textContent = page.events.length ? "" : "No events yet.";
    } catch (e) {
      message.textContent = e.message;
    }
  }, STATUS_EVERY_MS, message, () => {
    abort.abort();
    view.stop();
  });
}

export function mount(main, name) {
  return name ? mountLarge(main, name) : mountGrid(main);
}

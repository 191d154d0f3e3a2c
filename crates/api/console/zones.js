// The zone and line editor (#/streams/NAME): click points on the stream's picture (or
// type them, for the keyboard), then save with PUT .../zones or PUT .../lines. Points are
// kept as fractions of the frame ("normalized" units), so they hold at any resolution.

import { call, el, getJson, sendJson } from "./api.js";
import { colour, drawPicture, drawPlaces, polygon } from "./draw.js";

/** A zone or line as PUT accepts it (GET adds live figures, which PUT refuses). */
function zoneSpec(z) {
  const spec = { name: z.name, points: z.points, units: z.units, classes: z.classes };
  if (z.loiter_s !== null && z.loiter_s !== undefined) spec.loiter_s = z.loiter_s;
  return spec;
}

function lineSpec(l) {
  return { name: l.name, start: l.start, end: l.end, units: l.units, classes: l.classes };
}

function parsePoints(text) {
  return text.trim().split(/\s+/).filter(Boolean).map((pair) => {
    const [x, y] = pair.split(",").map(Number);
    if (!(x >= 0 && x <= 1 && y >= 0 && y <= 1)) throw new Error(`"${pair}" is not x,y between 0 and 1`);
    return [x, y];
  });
}

const round = (v) => Math.round(v * 1000) / 1000;

class Editor {
  constructor(name) {
    this.name = name;
    this.q = encodeURIComponent(name);
    this.places = { zones: [], lines: [] };
    this.draft = [];
    this.image = null;
    this.canvas = el("canvas", { role: "img", "aria-label": `${name}: picture; click to add points` });
    this.canvas.addEventListener("click", (e) => this.click(e));
    this.kind = el("select", { id: "place-kind" },
      el("option", { value: "zone" }, "Zone (3 points or more)"), el("option", { value: "line" }, "Line (2 points)"));
    this.placeName = el("input", { id: "place-name", required: true, autocomplete: "off" });
    this.points = el("input", { id: "place-points", placeholder: "0.5,0 0.5,1", autocomplete: "off" });
    this.points.addEventListener("input", () => this.typed());
    this.error = el("p", { class: "error", role: "alert" });
    this.list = el("ul");
  }

  click(e) {
    const r = this.canvas.getBoundingClientRect();
    this.draft.push([round((e.clientX - r.left) / r.width), round((e.clientY - r.top) / r.height)]);
    if (this.kind.value === "line" && this.draft.length > 2) this.draft = this.draft.slice(-2);
    this.points.value = this.draft.map((p) => p.join(",")).join(" ");
    this.draw();
  }

  typed() {
    try {
      this.draft = parsePoints(this.points.value);
      this.error.textContent = "";
    } catch (e) {
      this.error.textContent = e.message;
    }
    this.draw();
  }

  draw() {
    if (!this.image) return;
    const ctx = drawPicture(this.canvas, this.image);
    drawPlaces(ctx, this.places, null);
    const pts = this.draft.map(([x, y]) => [x * this.canvas.width, y * this.canvas.height]);
    ctx.lineWidth = Math.max(2, Math.round(this.canvas.width / 300));
    polygon(ctx, pts, colour(0), this.kind.value === "zone" && pts.length > 2);
    this.canvas.dataset.draft = String(this.draft.length);
  }

  /** Adds the draft to the zones or lines and saves that list. */
  async add() {
    const name = this.placeName.value.trim();
    if (!name) throw new Error("give the zone or line a name");
    if (this.kind.value === "line") {
      if (this.draft.length !== 2) throw new Error("a line needs exactly 2 points");
      const lines = this.places.lines.filter((l) => l.name !== name).map(lineSpec);
      lines.push({ name, start: this.draft[0], end: this.draft[1], units: "normalized", classes: [] });
      await this.save("lines", lines);
    } else {
      if (this.draft.length < 3) throw new Error("a zone needs 3 points or more");
      const zones = this.places.zones.filter((z) => z.name !== name).map(zoneSpec);
      zones.push({ name, points: this.draft, units: "normalized", classes: [] });
      await this.save("zones", zones);
    }
    this.draft = [];
    this.points.value = "";
    this.placeName.value = "";
  }

  async remove(kind, name) {
    const kept = kind === "zones"
      ? this.places.zones.filter((z) => z.name !== name).map(zoneSpec)
      : this.places.lines.filter((l) => l.name !== name).map(lineSpec);
    await this.save(kind, kept);
  }

  async save(kind, list) {
    this.places = await sendJson("PUT", `/v1/streams/${this.q}/${kind}`, list);
    this.render();
  }

  render() {
    const item = (kind, p) => {
      const b = el("button", { type: "button", class: "secondary", "aria-label": `Remove ${p.name}` }, "Remove");
      b.addEventListener("click", () => this.remove(kind, p.name).catch((e) => { this.error.textContent = e.message; }));
      const what = kind === "zones" ? `zone, ${p.objects} inside` : `line, in ${p.in} out ${p.out}`;
      return el("li", {}, `${p.name} (${what}) `, b);
    };
    this.list.replaceChildren(...this.places.zones.map((z) => item("zones", z)),
      ...this.places.lines.map((l) => item("lines", l)));
    if (this.places.zone_error) this.error.textContent = this.places.zone_error;
    this.draw();
  }

  async load() {
    this.places = await getJson(`/v1/streams/${this.q}/zones`);
    const response = await call(`/v1/streams/${this.q}/latest.jpg`);
    const url = URL.createObjectURL(await response.blob());
    const image = new Image();
    await new Promise((resolve, reject) => {
      image.onload = resolve;
      image.onerror = () => reject(new Error("the picture could not be decoded"));
      image.src = url;
    });
    this.image = image;
    this.render();
  }
}

export function mount(main, name) {
  const ed = new Editor(name);
  const form = el("form", { class: "panel", "aria-label": "New zone or line" },
    el("div", { class: "form" },
      el("div", { class: "field" }, el("label", { for: "place-kind" }, "Kind"), ed.kind),
      el("label", { for: "place-name" }, "Name", ed.placeName),
      el("label", { for: "place-points" }, "Points (x,y as fractions; or click the picture)", ed.points),
      el("div", { class: "toolbar" }, el("button", { type: "submit" }, "Save"),
        el("button", { type: "button", class: "secondary", onclick: () => { ed.draft = []; ed.points.value = ""; ed.draw(); } }, "Clear points"))),
    ed.error);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    ed.error.textContent = "";
    try {
      await ed.add();
    } catch (err) {
      ed.error.textContent = err.message;
    }
  });
  ed.kind.addEventListener("change", () => ed.draw());
  main.append(
    el("p", {}, el("a", { href: "#/streams" }, "← Streams")),
    el("h1", {}, `Zones and lines of ${name}`),
    el("div", { class: "split" },
      el("section", { class: "panel editor" }, el("div", { class: "frame" }, ed.canvas)),
      el("section", {}, form, el("h2", {}, "Configured"), ed.list)));
  ed.load().catch((e) => { ed.error.textContent = e.message; });
}

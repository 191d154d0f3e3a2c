// Playground: one image through POST /v1/detect with a chosen model, thresholds and
// classes; the boxes drawn on the image, the JSON, the timings and the same request as a
// curl command.

import { apiKey, call, el } from "./api.js";
import { drawDetections, drawPicture } from "./draw.js";
import { readiness } from "./models.js";

function controls() {
  const c = {
    file: el("input", { id: "pg-file", type: "file", accept: "image/*" }),
    model: el("select", { id: "pg-model" }, el("option", { value: "" }, "default")),
    conf: el("input", { id: "pg-conf", type: "number", min: "0", max: "1", step: "0.01", placeholder: "model default" }),
    iou: el("input", { id: "pg-iou", type: "number", min: "0", max: "1", step: "0.01", placeholder: "model default" }),
    classes: el("input", { id: "pg-classes", placeholder: "person,car or 0,2", autocomplete: "off" }),
  };
  readiness().then((r) => {
    for (const m of r.models) c.model.append(el("option", { value: m.name }, m.name));
  }).catch(() => {});
  return c;
}

function query(c) {
  const q = new URLSearchParams();
  if (c.model.value) q.set("model", c.model.value);
  if (c.conf.value) q.set("conf", c.conf.value);
  if (c.iou.value) q.set("iou", c.iou.value);
  if (c.classes.value.trim()) q.set("classes", c.classes.value.trim());
  return q.toString();
}

function curl(path, file) {
  const name = (file && file.name) || "image.jpg";
  const type = (file && file.type) || "image/jpeg";
  const quote = (s) => `'${s.replace(/'/g, "'\\''")}'`;
  return [`curl -sS -X POST ${quote(location.origin + path)}`,
    `  -H ${quote(`Content-Type: ${type}`)}`,
    // The key itself is never shown: the command reads it from the environment.
    ...(apiKey() ? ['  -H "Authorization: Bearer $PEREGRINE_API_KEY"'] : []),
    `  --data-binary @${quote(name)}`].join(" \\\n");
}

function timings(t) {
  const rows = [["decode", t.decode_ms], ["queue", t.queue_ms], ["inference", t.inference_ms], ["total", t.total_ms]];
  return el("table", { "aria-label": "Timings" },
    el("tbody", {}, rows.map(([k, v]) => el("tr", {}, el("th", { scope: "row" }, k), el("td", {}, `${v.toFixed(1)} ms`))),
      el("tr", {}, el("th", { scope: "row" }, "batch size"), el("td", {}, t.batch_size))));
}

async function detect(c, file, out) {
  const path = `/v1/detect${query(c) ? "?" + query(c) : ""}`;
  out.curl.textContent = curl(path, file);
  out.error.textContent = "";
  out.status.textContent = "Detecting…";
  try {
    const response = await call(path, {
      method: "POST", body: file, headers: { "Content-Type": file.type || "application/octet-stream" },
    });
    const result = await response.json();
    const url = URL.createObjectURL(file);
    const image = new Image();
    await new Promise((resolve, reject) => {
      image.onload = resolve;
      image.onerror = () => reject(new Error("the browser cannot show this image"));
      image.src = url;
    });
    const ctx = drawPicture(out.canvas, image);
    URL.revokeObjectURL(url);
    drawDetections(ctx, result.detections, result);
    out.canvas.dataset.boxes = String(result.detections.length);
    out.canvas.setAttribute("aria-label",
      `${result.detections.length} detections: ${result.detections.map((d) => d.class_name).join(", ")}`);
    out.json.textContent = JSON.stringify(result, null, 2);
    out.timings.replaceChildren(timings(result.timings));
    out.status.textContent = `${result.detections.length} detections by ${result.model} version ${result.version}`;
  } catch (e) {
    out.status.textContent = "";
    out.error.textContent = e.message;
  }
}

export function mount(main) {
  const c = controls();
  const out = {
    canvas: el("canvas", { role: "img", "aria-label": "No image yet" }),
    json: el("pre", { tabindex: 0, "aria-label": "Response JSON", id: "pg-json" }),
    curl: el("pre", { tabindex: 0, "aria-label": "The same request with curl", id: "pg-curl" }),
    timings: el("div"),
    error: el("p", { class: "error", role: "alert" }),
    status: el("p", { class: "muted", "aria-live": "polite", id: "pg-status" }),
  };
  let file = null;
  const run = () => { if (file) detect(c, file, out); };
  const drop = el("div", { class: "drop" }, el("label", { for: "pg-file" }, "Drop an image here, or choose one: "), c.file);
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    if (e.dataTransfer.files.length) { file = e.dataTransfer.files[0]; run(); }
  });
  c.file.addEventListener("change", () => { file = c.file.files[0] || null; run(); });
  const form = el("form", { class: "panel form", "aria-label": "Detection settings" },
    el("div", { class: "field" }, el("label", { for: "pg-model" }, "Model"), c.model), el("label", { for: "pg-conf" }, "Confidence", c.conf),
    el("label", { for: "pg-iou" }, "IoU", c.iou), el("label", { for: "pg-classes" }, "Classes", c.classes),
    el("div", {}, el("button", { type: "submit" }, "Detect again")));
  form.addEventListener("submit", (e) => { e.preventDefault(); run(); });
  main.append(el("h1", {}, "Playground"), drop, form, out.error, out.status,
    el("div", { class: "split" },
      el("section", { class: "panel" }, el("div", { class: "frame" }, out.canvas)),
      el("section", {}, el("h2", {}, "Timings"), out.timings, el("h2", {}, "curl"), out.curl,
        el("h2", {}, "Response"), out.json)));
}

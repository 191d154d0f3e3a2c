// Drawing on a canvas in the frame's own pixels: the picture, then its boxes, zones and
// lines, so that everything drawn lines up with the frame it belongs to whatever size the
// canvas is shown at.

const PALETTE = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4",
  "#f032e6", "#bfef45", "#469990", "#9a6324", "#800000", "#000075"];

export function colour(n) {
  return PALETTE[Math.abs(n | 0) % PALETTE.length];
}

/** Fits the canvas to the picture and draws it. */
export function drawPicture(canvas, image) {
  if (canvas.width !== image.naturalWidth || canvas.height !== image.naturalHeight) {
    canvas.width = image.naturalWidth;
    canvas.height = image.naturalHeight;
  }
  const ctx = canvas.getContext("2d");
  ctx.drawImage(image, 0, 0);
  return ctx;
}

/** Boxes with "label score #track" tags; `detections` are the wire schema's. */
export function drawDetections(ctx, detections, { width, height } = {}) {
  const sx = width ? ctx.canvas.width / width : 1;
  const sy = height ? ctx.canvas.height / height : 1;
  const line = Math.max(2, Math.round(ctx.canvas.width / 400));
  ctx.font = `${Math.max(12, line * 7)}px system-ui, sans-serif`;
  ctx.textBaseline = "top";
  for (const d of detections) {
    const [x1, y1, x2, y2] = d.box;
    const c = colour(d.track_id ?? d.class_id);
    ctx.strokeStyle = c;
    ctx.lineWidth = line;
    ctx.strokeRect(x1 * sx, y1 * sy, (x2 - x1) * sx, (y2 - y1) * sy);
    const tag = `${d.class_name ?? d.label} ${d.score.toFixed(2)}` +
      (d.track_id !== undefined ? ` #${d.track_id}` : "");
    const w = ctx.measureText(tag).width + 6;
    const h = line * 7 + 4;
    const ty = y1 * sy - h < 0 ? y1 * sy : y1 * sy - h;
    ctx.fillStyle = c;
    ctx.fillRect(x1 * sx, ty, w, h);
    ctx.fillStyle = "#fff";
    ctx.fillText(tag, x1 * sx + 3, ty + 2);
  }
}

/** A point of a zone or line in canvas pixels (`units` "normalized" or "pixels"). */
export function toCanvas(ctx, [x, y], units, frame) {
  if (units === "normalized") return [x * ctx.canvas.width, y * ctx.canvas.height];
  const sx = frame && frame.width ? ctx.canvas.width / frame.width : 1;
  const sy = frame && frame.height ? ctx.canvas.height / frame.height : 1;
  return [x * sx, y * sy];
}

/** Zones (filled polygons) and lines (with their in/out counts), as GET .../zones
 * describes them; `frame` is the frame size that pixel units refer to. */
export function drawPlaces(ctx, places, frame) {
  const width = Math.max(2, Math.round(ctx.canvas.width / 300));
  ctx.lineWidth = width;
  ctx.font = `${Math.max(12, width * 7)}px system-ui, sans-serif`;
  for (const [i, z] of (places.zones || []).entries()) {
    const pts = z.points.map((p) => toCanvas(ctx, p, z.units, frame));
    polygon(ctx, pts, colour(i + 3), true);
    // At the centre, so that zones sharing a corner keep their labels apart.
    const centre = [0, 1].map((k) => pts.reduce((a, p) => a + p[k], 0) / pts.length);
    label(ctx, centre, `${z.name}: ${z.objects ?? 0}`, colour(i + 3));
  }
  for (const [i, l] of (places.lines || []).entries()) {
    const a = toCanvas(ctx, l.start, l.units, frame);
    const b = toCanvas(ctx, l.end, l.units, frame);
    polygon(ctx, [a, b], colour(i + 7), false);
    label(ctx, a, `${l.name}: in ${l.in ?? 0} out ${l.out ?? 0}`, colour(i + 7));
  }
}

export function polygon(ctx, pts, c, closed) {
  if (!pts.length) return;
  ctx.beginPath();
  ctx.moveTo(...pts[0]);
  for (const p of pts.slice(1)) ctx.lineTo(...p);
  if (closed) ctx.closePath();
  ctx.strokeStyle = c;
  ctx.stroke();
  if (closed) {
    ctx.globalAlpha = 0.15;
    ctx.fillStyle = c;
    ctx.fill();
    ctx.globalAlpha = 1;
  }
  ctx.fillStyle = c;
  for (const [x, y] of pts) ctx.fillRect(x - 4, y - 4, 8, 8);
}

function label(ctx, [x, y], text, c) {
  ctx.textBaseline = "top";
  const w = ctx.measureText(text).width + 6;
  ctx.fillStyle = c;
  ctx.fillRect(x, y, w, parseInt(ctx.font, 10) + 4);
  ctx.fillStyle = "#fff";
  ctx.fillText(text, x + 3, y + 2);
}

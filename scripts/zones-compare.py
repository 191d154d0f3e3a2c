#!/usr/bin/env python3
"""Peregrine's zones and lines (crates/zones) against supervision's PolygonZone and LineZone.

  zones-compare.py compare DEFINITION TRACKS [--bin PATH]
      Runs both over the same tracked boxes and prints the agreement: per-frame zone
      membership, the set of (frame, track, line, direction) crossings, final in/out counts.
      Exit status 1 when they differ.
  zones-compare.py synth OUT_DIR [--seed N] [--frames N] [--objects N]
      Writes OUT_DIR/definition.json and OUT_DIR/tracks.jsonl: random walks through four
      zones and four lines, some boxes jittering on a border or a line, some dropped frames.
  zones-compare.py grid OUT_DIR [--seed N]
      Writes six random star-shaped zones on a 220x220 frame and one frame per pixel row
      with a box whose anchor is on each pixel: every pixel's membership gets compared.
  zones-compare.py track DETECTIONS.json OUT.jsonl [--fps F]
      Turns `peregrine detect --format json` output over a clip's frames (sorted by file
      name) into tracked boxes with supervision/trackers' ByteTrack.

TRACKS is JSON lines: {"frame": n, "pts_ms": t, "objects": [{"track_id", "class_id",
"bbox": [x1, y1, x2, y2]}]}. DEFINITION: {"frame": [w, h], "anchor": "bottom_center",
"hysteresis": {"frames": 1, "margin_px": 0}, "zones": [{"name", "points": [[x, y], ..],
"units": "pixels"|"normalized", "classes": [ids] or null, "loiter_s": null}], "lines":
[{"name", "start": [x, y], "end": [x, y], "units", "classes"}]}. supervision gets
minimum_crossing_threshold = hysteresis.frames and no margin; Peregrine's
`zones_jsonl` example (cargo run -p peregrine-zones --example zones_jsonl) gets it all.

Needs (pinned in the report): supervision, trackers (for `track`), numpy, opencv-python.
"""

import argparse
import json
import math
import os
import random
import subprocess
import sys
from collections import Counter

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def f32(value):
    """Peregrine reads coordinates as f32: give supervision the same numbers."""
    return float(np.float32(value))


def pixels(point, units, frame):
    x, y = f32(point[0]), f32(point[1])
    if units == "normalized":  # as Peregrine: snapped to 1/256 px
        return round(x * frame[0] * 256) / 256, round(y * frame[1] * 256) / 256
    return x, y


def read_jsonl(path):
    with open(path) as lines:
        return [json.loads(line) for line in lines if line.strip()]


def run_supervision(definition, frames):
    import supervision as sv

    size = definition["frame"]
    anchor = sv.Position[definition.get("anchor", "bottom_center").upper()]
    threshold = max(1, int(definition.get("hysteresis", {}).get("frames", 1)))
    zones = []
    for z in definition.get("zones", []):
        polygon = np.array([pixels(p, z.get("units"), size) for p in z["points"]])
        zones.append((z, sv.PolygonZone(polygon=polygon, triggering_anchors=[anchor])))
    lines = []
    for ln in definition.get("lines", []):
        start = sv.Point(*pixels(ln["start"], ln.get("units"), size))
        end = sv.Point(*pixels(ln["end"], ln.get("units"), size))
        zone = sv.LineZone(start=start, end=end, triggering_anchors=[anchor],
                           minimum_crossing_threshold=threshold)
        lines.append((ln, zone))
    membership, crossings = [], set()
    for frame in frames:
        objects = frame["objects"]
        xyxy = np.array([[f32(v) for v in o["bbox"]] for o in objects], dtype=np.float64)
        detections = sv.Detections(
            xyxy=xyxy.reshape(-1, 4),
            class_id=np.array([o["class_id"] for o in objects], dtype=int),
            tracker_id=np.array([o["track_id"] for o in objects], dtype=int),
        )

        def watched(spec):
            if spec.get("classes") is None:
                return detections
            return detections[np.isin(detections.class_id, spec["classes"])]

        inside = {}
        for spec, zone in zones:
            d = watched(spec)
            hits = zone.trigger(d) if len(d) else np.array([], dtype=bool)
            inside[spec["name"]] = sorted(int(t) for t in d.tracker_id[hits])
        membership.append(inside)
        for spec, line in lines:
            d = watched(spec)
            crossed_in, crossed_out = line.trigger(d)
            for track, went_in, went_out in zip(d.tracker_id, crossed_in, crossed_out):
                if went_in or went_out:
                    crossings.add((frame["frame"], int(track), spec["name"],
                                   "in" if went_in else "out"))
    counts = {spec["name"]: {"in": {int(k): v for k, v in line.in_count_per_class.items()},
                             "out": {int(k): v for k, v in line.out_count_per_class.items()}}
              for spec, line in lines}
    return membership, crossings, counts


def run_peregrine(definition_path, tracks_path, binary):
    command = [binary] if binary else [
        "cargo", "run", "-q", "--release", "-p", "peregrine-zones", "--example", "zones_jsonl",
        "--"]
    paths = [os.path.abspath(definition_path), os.path.abspath(tracks_path)]
    run = subprocess.run(command + paths, cwd=REPO, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"zones_jsonl failed: {run.stderr.strip()}")
    out = run.stdout.splitlines()
    rows = [json.loads(line) for line in out]
    counts = {name: {d: {int(k): v for k, v in c[d].items()} for d in ("in", "out")}
              for name, c in rows[-1]["counts"].items()}
    membership = [r["zones"] for r in rows[:-1]]
    crossings = {(r["frame"], t, name, d) for r in rows[:-1] for t, name, d in r["crossings"]}
    return membership, crossings, counts


def boundary_distance(polygon, p):
    best = math.inf
    for (ax, ay), (bx, by) in zip(polygon, polygon[1:] + polygon[:1]):
        vx, vy = bx - ax, by - ay
        t = max(0.0, min(1.0, ((p[0] - ax) * vx + (p[1] - ay) * vy) / (vx * vx + vy * vy)))
        best = min(best, math.hypot(p[0] - ax - t * vx, p[1] - ay - t * vy))
    return best


def compare(args):
    definition = json.load(open(args.definition))
    frames = read_jsonl(args.tracks)
    ours = run_peregrine(args.definition, args.tracks, args.bin)
    theirs = run_supervision(definition, frames)
    size, anchor = definition["frame"], definition.get("anchor", "bottom_center")
    polygons = {z["name"]: [pixels(p, z.get("units"), size) for p in z["points"]]
                for z in definition.get("zones", [])}
    agree = total = only_sv = 0
    worst = 0.0
    differing = Counter()
    for frame, mine, sv_inside in zip(frames, ours[0], theirs[0]):
        boxes = {o["track_id"]: o["bbox"] for o in frame["objects"]}
        for name, polygon in polygons.items():
            a, b = set(mine.get(name, [])), set(sv_inside.get(name, []))
            total += len(a | b)
            agree += len(a & b)
            only_sv += len(b - a)
            differing[name] += len(a ^ b)
            for track in a ^ b:
                x1, y1, x2, y2 = (f32(v) for v in boxes[track])
                point = {"bottom_center": ((x1 + x2) / 2, y2), "center": ((x1 + x2) / 2, (y1 + y2) / 2)
                         }.get(anchor, ((x1 + x2) / 2, y2))
                point = (np.rint(point[0]), np.rint(point[1]))
                worst = max(worst, boundary_distance(polygon, point))
    observations = sum(len(f["objects"]) for f in frames)
    print(f"frames {len(frames)}, objects seen {observations}, zones {len(polygons)}, "
          f"lines {len(definition.get('lines', []))}, hysteresis {definition.get('hysteresis')}")
    print(f"zone membership: {agree}/{total} (track, frame, zone) inside in both; "
          f"{total - agree} differ ({only_sv} inside for supervision only)"
          + (f", farthest {worst:.2f} px from a border" if total > agree else ""))
    if any(differing.values()):
        print("  differences by zone:", dict(differing))
    both = ours[1] & theirs[1]
    print(f"crossings: peregrine {len(ours[1])}, supervision {len(theirs[1])}, in both {len(both)}")
    for c in sorted(ours[1] ^ theirs[1])[:10]:
        print("  differs:", c, "(peregrine only)" if c in ours[1] else "(supervision only)")
    same_counts = ours[2] == theirs[2]
    print(f"final counts {'equal' if same_counts else 'differ'}: peregrine {ours[2]}")
    if not same_counts:
        print(f"                      supervision {theirs[2]}")
    exact = agree == total and ours[1] == theirs[1] and same_counts
    print("EXACT" if exact else "DIFFERENT")
    return 0 if exact else 1


def synth(args):
    rng = random.Random(args.seed)
    width, height = 1280, 720
    definition = {
        "frame": [width, height], "anchor": "bottom_center",
        "hysteresis": {"frames": 1, "margin_px": 0},
        "zones": [
            {"name": "dock", "points": [[100, 100], [500, 100], [500, 400], [100, 400]]},
            {"name": "ramp", "points": [[600, 150], [1100, 250], [1000, 600], [650, 500]]},
            {"name": "corner", "points": [[0.55, 0.6], [0.95, 0.6], [0.95, 0.975], [0.8, 0.975],
                                          [0.8, 0.8], [0.55, 0.8]], "units": "normalized"},
            {"name": "cars", "points": [[50, 450], [450, 700], [50, 700]], "classes": [2]},
        ],
        "lines": [
            {"name": "gate", "start": [100, 360], "end": [1180, 360]},
            {"name": "door", "start": [640, 40], "end": [640, 680]},
            {"name": "diagonal", "start": [200, 650], "end": [1100, 80]},
            {"name": "people", "start": [0.1, 0.2], "end": [0.9, 0.25], "units": "normalized",
             "classes": [0]},
        ],
    }
    # Coordinates on a 1/16 px grid are exact in f32 and f64 alike.
    q = lambda v: round(v * 16) / 16
    borders = [(500, None), (None, 360), (640, None), (None, 400)]
    tracks = []
    for track in range(1, args.objects + 1):
        birth = rng.randrange(0, args.frames - 20)
        life = rng.randrange(20, min(400, args.frames - birth) + 1)
        w, h = rng.uniform(20, 80), rng.uniform(40, 160)
        if rng.random() < 0.3:  # a box jittering on a border or a line
            bx, by = borders[rng.randrange(len(borders))]
            x = bx if bx is not None else rng.uniform(150, 450)
            y = by if by is not None else rng.uniform(150, 350)
            tracks.append(dict(track=track, birth=birth, life=life, w=w, h=h, x=x, y=y,
                               vx=0.0, vy=0.0, jitter=rng.uniform(1, 6), cls=rng.randrange(4)))
        else:
            tracks.append(dict(track=track, birth=birth, life=life, w=w, h=h,
                               x=rng.uniform(0, width), y=rng.uniform(0, height),
                               vx=rng.uniform(-8, 8), vy=rng.uniform(-6, 6), jitter=0.0,
                               cls=rng.randrange(4)))
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "tracks.jsonl"), "w") as out:
        for frame in range(args.frames):
            objects = []
            for t in tracks:
                if not t["birth"] <= frame < t["birth"] + t["life"]:
                    continue
                t["vx"] = 0.97 * t["vx"] + rng.gauss(0, 0.8)
                t["vy"] = 0.97 * t["vy"] + rng.gauss(0, 0.6)
                t["x"] = min(max(t["x"] + t["vx"], -50), width + 50)
                t["y"] = min(max(t["y"] + t["vy"], -50), height + 50)
                if rng.random() < 0.05:  # a missed detection
                    continue
                cx = t["x"] + rng.uniform(-t["jitter"], t["jitter"])
                bottom = t["y"] + rng.uniform(-t["jitter"], t["jitter"])
                bbox = [q(cx - t["w"] / 2), q(bottom - t["h"]), q(cx + t["w"] / 2), q(bottom)]
                objects.append({"track_id": t["track"], "class_id": t["cls"], "bbox": bbox})
            out.write(json.dumps({"frame": frame, "pts_ms": frame * 40, "objects": objects}) + "\n")
    with open(os.path.join(args.out_dir, "definition.json"), "w") as out:
        json.dump(definition, out, indent=1)


def grid(args):
    rng = random.Random(args.seed)
    zones = []
    for k in range(6):
        cx, cy = rng.randint(60, 140), rng.randint(60, 140)
        points = []
        for angle in sorted(rng.uniform(0, 2 * math.pi) for _ in range(rng.randint(3, 9))):
            radius = rng.uniform(15, 60)
            point = [round(cx + radius * math.cos(angle)), round(cy + radius * math.sin(angle))]
            if point not in points:
                points.append(point)
        zones.append({"name": f"z{k}", "points": points})
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "definition.json"), "w") as out:
        json.dump({"frame": [220, 220], "anchor": "bottom_center",
                   "hysteresis": {"frames": 1, "margin_px": 0}, "zones": zones, "lines": []}, out)
    with open(os.path.join(args.out_dir, "tracks.jsonl"), "w") as out:
        for y in range(215):
            objects = [{"track_id": x + 1, "class_id": 0, "bbox": [x - 3, y - 10, x + 3, y]}
                       for x in range(215)]
            out.write(json.dumps({"frame": y, "pts_ms": y * 40, "objects": objects}) + "\n")


def track(args):
    import supervision as sv
    from trackers import ByteTrackTracker

    # `peregrine detect --format json` prints one JSON object per image.
    results = sorted(read_jsonl(args.detections), key=lambda r: r["image"])
    tracker = ByteTrackTracker(frame_rate=args.fps, track_activation_threshold=args.activation)
    with open(args.out, "w") as out:
        for n, result in enumerate(results):
            boxes = result["detections"]
            xyxy = np.array([b["box"] for b in boxes], dtype=np.float32).reshape(-1, 4)
            detections = sv.Detections(
                xyxy=xyxy.astype(np.float64),
                confidence=np.array([b["score"] for b in boxes], dtype=float),
                class_id=np.array([b["class_id"] for b in boxes], dtype=int),
            )
            tracked = tracker.update(detections)
            objects = [{"track_id": int(t), "class_id": int(c), "bbox": [float(v) for v in xy]}
                       for xy, c, t in zip(tracked.xyxy, tracked.class_id, tracked.tracker_id)
                       if t >= 0]
            out.write(json.dumps({"frame": n, "pts_ms": n * 1000.0 / args.fps, "objects": objects}) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("compare")
    p.add_argument("definition")
    p.add_argument("tracks")
    p.add_argument("--bin", help="a built zones_jsonl example (default: cargo run --release)")
    p = sub.add_parser("synth")
    p.add_argument("out_dir")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--frames", type=int, default=1500)
    p.add_argument("--objects", type=int, default=120)
    p = sub.add_parser("grid")
    p.add_argument("out_dir")
    p.add_argument("--seed", type=int, default=1)
    p = sub.add_parser("track")
    p.add_argument("detections")
    p.add_argument("out")
    p.add_argument("--fps", type=float, default=25.0)
    p.add_argument("--activation", type=float, default=0.7,
                   help="ByteTrack's track_activation_threshold (trackers' default 0.7)")
    args = parser.parse_args()
    sys.exit({"compare": compare, "synth": synth, "grid": grid, "track": track}[args.command](args) or 0)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Peregrine's tracker against Roboflow's `trackers.ByteTrackTracker` on the same detections.

Both trackers are fed the same per-frame detections; `trackers`' confirmed tracks are the
ground truth and Peregrine's the hypothesis. Per clip it prints IDF1, ID switches and how many
detections only one side tracked (motmetrics, IoU >= 0.5 between boxes; the boxes are the same
detections on both sides, so IoU is 1 wherever both track one).

Inputs are JSON lines, one frame per line, as `peregrine detect --format json` writes them:
    {"detections": [{"class_id": 0, "score": 0.9, "box": [x1, y1, x2, y2]}, ...], ...}
optionally with "pts_seconds" (the frame's media time, as the server's detection events carry
it). There must be a line for every frame the detector saw, empty ones included: both trackers
step their motion model once per line. Lines that already carry a
"track_id" on each detection (e.g. from the real server) are compared as they are (--tracked);
otherwise they go through crates/track's example `track_jsonl`.

    # detections for the shared clips (GStreamer frames, the released binary), then compare:
    scripts/track-compare.py --detect-clips ../shared/videos --detector /work/bench/peregrine-after
    # any JSONL of detections, at a known frame rate:
    scripts/track-compare.py --fps 25 detections.jsonl

`trackers` has no classes: Peregrine's default class-aware mode is compared against one
ByteTrackTracker per class, --class-agnostic against a single one. Both run one Kalman step
per frame (trackers without timestamps); Peregrine's media-time lost budget is set to the
frames trackers keeps a lost track at this frame rate, so both use one budget.

Packages: tests/video/requirements-tracking.txt.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import motmetrics as mm
import numpy as np
import supervision as sv
from trackers import ByteTrackTracker

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "target" / "release" / "examples" / "track_jsonl"


def read_frames(path: Path) -> list[dict]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


# Settings given to both sides: (flag, ByteTrackTracker argument, track_jsonl flag).
SHARED_SETTINGS = [
    ("high_score", "high_conf_det_threshold", "--high-score"),
    ("new_track_score", "track_activation_threshold", "--new-track-score"),
    ("match_iou", "minimum_iou_threshold", "--match-iou"),
    ("min_hits", "minimum_consecutive_frames", "--min-hits"),
]


def trackers_ids(frames: list[dict], fps: float, class_aware: bool, settings: dict) -> tuple[list[list], int]:
    """trackers' id per detection per frame (None: untracked), and its lost budget in frames."""
    by_class: dict[object, ByteTrackTracker] = {}
    kwargs = {theirs: settings[ours] for ours, theirs, _ in SHARED_SETTINGS if settings.get(ours) is not None}

    def tracker_for(key):
        if key not in by_class:
            by_class[key] = ByteTrackTracker(frame_rate=fps, **kwargs)
        return by_class[key]

    out = []
    for frame in frames:
        dets = frame["detections"]
        ids: list = [None] * len(dets)
        groups: dict[object, list[int]] = defaultdict(list)
        for i, d in enumerate(dets):
            groups[d["class_id"] if class_aware else None].append(i)
        # Every class's tracker steps every frame, with or without detections of its class.
        for key in list(by_class) + [k for k in groups if k not in by_class]:
            idx = groups.get(key, [])
            detections = sv.Detections(
                xyxy=np.array([dets[i]["box"] for i in idx], dtype=np.float32).reshape(-1, 4),
                confidence=np.array([dets[i]["score"] for i in idx], dtype=np.float32),
                class_id=np.array([dets[i]["class_id"] for i in idx], dtype=int),
                data={"index": np.array(idx, dtype=int)},
            )
            result = tracker_for(key).update(detections)
            if len(result) == 0:
                continue
            for index, tid in zip(result.data["index"], result.tracker_id):
                if tid != -1:
                    ids[int(index)] = f"{key}:{int(tid)}"
        out.append(ids)
    budget = ByteTrackTracker(frame_rate=fps, **kwargs).maximum_frames_without_update
    return out, budget


def peregrine_ids(frames: list[dict], fps: float, class_aware: bool, budget_frames: int, example: Path, settings: dict) -> list[list]:
    if not example.exists():
        subprocess.run(["cargo", "build", "--release", "-p", "peregrine-track", "--example", "track_jsonl"], cwd=ROOT, check=True)
    # Half a frame over trackers' budget: the same frame count, safe from rounding in the times.
    args = [str(example), "--fps", str(fps), "--lost-after-s", repr((budget_frames + 0.5) / fps)]
    if not class_aware:
        args.append("--class-agnostic")
    for ours, _, flag in SHARED_SETTINGS:
        if settings.get(ours) is not None:
            args += [flag, str(settings[ours])]
    lines = "".join(json.dumps(f) + "\n" for f in frames)
    run = subprocess.run(args, input=lines, capture_output=True, text=True, check=True)
    return [[d["track_id"] for d in json.loads(line)["detections"]] for line in run.stdout.splitlines()]


def box_iou_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """1 - IoU, NaN under IoU 0.5 (motmetrics 1.4's own iou_matrix fails under NumPy 2)."""
    if len(a) == 0 or len(b) == 0:
        return np.empty((len(a), len(b)))
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(axis=2)
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])
    union = area(a)[:, None] + area(b)[None, :] - inter
    iou = np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)
    return np.where(iou >= 0.5, 1 - iou, np.nan)


def compare(frames: list[dict], truth: list[list], ours: list[list]) -> dict:
    acc = mm.MOTAccumulator(auto_id=True)
    # motmetrics (under pandas 3) wants numeric ids: number every distinct id.
    numbers: dict[object, int] = {}
    number = lambda side, i: numbers.setdefault((side, i), len(numbers))
    only_truth = only_ours = 0
    for frame, t_ids, o_ids in zip(frames, truth, ours, strict=True):
        boxes = np.array([d["box"] for d in frame["detections"]], dtype=np.float64).reshape(-1, 4)
        t_idx = [i for i, t in enumerate(t_ids) if t is not None]
        o_idx = [i for i, o in enumerate(o_ids) if o is not None]
        only_truth += len(set(t_idx) - set(o_idx))
        only_ours += len(set(o_idx) - set(t_idx))
        acc.update([number("t", t_ids[i]) for i in t_idx], [number("o", o_ids[i]) for i in o_idx], box_iou_distance(boxes[t_idx], boxes[o_idx]))
    summary = mm.metrics.create().compute(acc, metrics=["idf1", "num_switches", "num_unique_objects", "num_objects"], name="clip")
    row = summary.loc["clip"]
    return {
        "idf1": float(row["idf1"]),
        "id_switches": int(row["num_switches"]),
        "tracks": int(row["num_unique_objects"]),
        "tracked_detections": int(row["num_objects"]),
        "tracked_only_by_trackers": only_truth,
        "tracked_only_by_peregrine": only_ours,
    }


def clip_fps(video: Path) -> float:
    caps = subprocess.run(
        ["gst-launch-1.0", "-v", "filesrc", f"location={video}", "!", "qtdemux", "!", "fakesink", "num-buffers=1"],
        capture_output=True, text=True, check=True,
    ).stdout
    num, den = re.search(r"framerate=\(fraction\)(\d+)/(\d+)", caps).groups()
    return int(num) / int(den)


def detect_clip(video: Path, detector: str, work: Path, conf: float) -> Path:
    """Frames through GStreamer, detections through `<detector> detect`; returns the JSONL."""
    frames_dir = work / video.stem
    frames_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["gst-launch-1.0", "-q", "filesrc", f"location={video}", "!", "qtdemux", "!", "h264parse", "!", "avdec_h264",
         "!", "videoconvert", "!", "jpegenc", "!", "multifilesink", f"location={frames_dir}/%05d.jpg"],
        check=True,
    )
    jpegs = sorted(str(p) for p in frames_dir.glob("*.jpg"))
    out = work / f"{video.stem}.jsonl"
    with out.open("w") as f:
        subprocess.run([detector, "detect", *jpegs, "--format", "json", "--conf", str(conf)], stdout=f, check=True, cwd=ROOT)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("jsonl", nargs="*", type=Path, help="per-frame detections, one file per clip")
    p.add_argument("--fps", type=float, default=30.0, help="frame rate of the JSONL inputs (default 30)")
    p.add_argument("--detect-clips", type=Path, help="directory of .mp4 clips to extract and detect first")
    p.add_argument("--detector", default="/work/bench/peregrine-after", help="peregrine binary for --detect-clips")
    p.add_argument("--conf", type=float, default=0.1, help="detector score floor for --detect-clips (ByteTrack wants low-score boxes)")
    p.add_argument("--work", type=Path, help="where --detect-clips puts frames and detections (default: a temporary directory)")
    p.add_argument("--class-agnostic", action="store_true", help="one trackers tracker for all classes, Peregrine's class_aware off")
    p.add_argument("--tracked", action="store_true", help="the inputs already carry Peregrine's track_id: compare them as they are")
    p.add_argument("--example", type=Path, default=EXAMPLE, help="the track_jsonl example binary")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--high-score", type=float, help="both sides (trackers' high_conf_det_threshold); default: each side's default")
    p.add_argument("--new-track-score", type=float, help="both sides (trackers' track_activation_threshold)")
    p.add_argument("--match-iou", type=float, help="both sides (trackers' minimum_iou_threshold)")
    p.add_argument("--min-hits", type=int, help="both sides (trackers' minimum_consecutive_frames)")
    args = p.parse_args()

    inputs: list[tuple[str, Path, float]] = [(path.name.split(".")[0], path, args.fps) for path in args.jsonl]
    if args.detect_clips:
        work = args.work or Path(tempfile.mkdtemp(prefix="track-compare-"))
        for video in sorted(args.detect_clips.glob("*.mp4")):
            inputs.append((video.stem, detect_clip(video, args.detector, work, args.conf), clip_fps(video)))
    if not inputs:
        p.error("give JSONL files or --detect-clips")

    class_aware = not args.class_agnostic
    settings = {ours: getattr(args, ours) for ours, _, _ in SHARED_SETTINGS}
    results = {}
    for name, path, fps in inputs:
        frames = read_frames(path)
        truth, budget = trackers_ids(frames, fps, class_aware, settings)
        if args.tracked:
            ours = [[d.get("track_id") for d in f["detections"]] for f in frames]
        else:
            ours = peregrine_ids(frames, fps, class_aware, budget, args.example, settings)
        results[name] = {"frames": len(frames), "fps": round(fps, 3), **compare(frames, truth, ours)}

    if args.json:
        print(json.dumps(results, indent=2))
    else:
        mode = "class-aware" if class_aware else "class-agnostic"
        print(f"{'clip':<16} {'frames':>6} {'tracks':>6} {'IDF1':>7} {'IDsw':>5} {'only trackers':>13} {'only peregrine':>14}  ({mode})")
        for name, r in results.items():
            print(f"{name:<16} {r['frames']:>6} {r['tracks']:>6} {r['idf1']:>7.4f} {r['id_switches']:>5} "
                  f"{r['tracked_only_by_trackers']:>13} {r['tracked_only_by_peregrine']:>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

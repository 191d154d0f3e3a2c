#!/usr/bin/env python3
"""Compares detections (peregrine detect's JSON lines) of one run with others, image by
image: a pair matches when the class is the same, the IoU is at least --iou (0.9) and the
scores are within --score (0.02), one to one, best IoU first. Used for the GPU's parity
with the CPU path, and for what another canvas changes (docs/benchmarks.md).

    scripts/compare-detections.py [--iou X] [--score D] [--prefix P] REFERENCE.jsonl OTHER.jsonl...

--prefix keeps only the images whose file name starts with P.
"""
import argparse
import json


def load(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {r["image"].split("/")[-1]: r["detections"] for r in rows}


def iou(a, b):
    iw = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0


def matched(x, y, min_iou, max_score_diff):
    candidates = ((iou(a["box"], b["box"]), i, j)
                  for i, a in enumerate(x) for j, b in enumerate(y)
                  if a["class_id"] == b["class_id"] and abs(a["score"] - b["score"]) <= max_score_diff)
    pairs = sorted((p for p in candidates if p[0] >= min_iou), reverse=True)
    used_a, used_b, n = set(), set(), 0
    for _, i, j in pairs:
        if i not in used_a and j not in used_b:
            used_a.add(i)
            used_b.add(j)
            n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iou", type=float, default=0.9)
    ap.add_argument("--score", type=float, default=0.02)
    ap.add_argument("--prefix", default="")
    ap.add_argument("reference")
    ap.add_argument("others", nargs="+")
    a = ap.parse_args()
    ref = {k: v for k, v in load(a.reference).items() if k.startswith(a.prefix)}
    total_ref = sum(len(v) for v in ref.values())
    for path in a.others:
        other = load(path)
        total_other = sum(len(other.get(k, [])) for k in ref)
        m = sum(matched(ref[k], other.get(k, []), a.iou, a.score) for k in ref)
        print(path, "reference", total_ref, "other", total_other, "matched", m,
              f"recall {m / max(total_ref, 1):.4f} precision {m / max(total_other, 1):.4f}")


if __name__ == "__main__":
    main()

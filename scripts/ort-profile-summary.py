#!/usr/bin/env python3
"""Sums an ONNX Runtime profile (the Chrome trace JSON that `--ort-profile` writes) by
operator type: time per run, share of all node time, and the run time it sits in.

    scripts/ort-profile-summary.py PROFILE.json [--skip N]

--skip drops the first N runs (warm-up). On a GPU provider a node's time is the time its
kernels took to launch unless CUDA_LAUNCH_BLOCKING=1 made every launch wait for its kernel.
"""
import argparse
import collections
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("--skip", type=int, default=2)
    args = ap.parse_args()
    events = json.load(open(args.profile))
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    if len(runs) <= args.skip:
        raise SystemExit(f"only {len(runs)} runs in the profile")
    kept = runs[args.skip:]
    start = kept[0]["ts"]
    by_op = collections.defaultdict(lambda: [0, 0])
    nodes_per_run = collections.Counter()
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time") or e["ts"] < start:
            continue
        a = e.get("args", {})
        key = (a.get("op_name", "?"), a.get("provider", "?").replace("ExecutionProvider", ""))
        by_op[key][0] += e["dur"]
        by_op[key][1] += 1
    n = len(kept)
    run_us = sum(r["dur"] for r in kept) / n
    node_us = sum(v[0] for v in by_op.values()) / n
    print(f"{n} runs, mean run {run_us / 1e3:.2f} ms, node time {node_us / 1e3:.2f} ms per run")
    print(f"{'op':<28}{'provider':<10}{'nodes':>6}{'ms/run':>9}{'share':>8}")
    for (op, prov), (dur, count) in sorted(by_op.items(), key=lambda kv: -kv[1][0]):
        print(f"{op:<28}{prov:<10}{count / n:>6.0f}{dur / n / 1e3:>9.3f}{dur / n / node_us:>8.1%}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""How many 720p25 cameras this machine serves with detection, through the real server.

Starts `peregrine serve` with no streams, then, for each count N in the sweep, adds looped
copies of a 720p25 clip (played at its own rate, like cameras) until N run, lets them
settle, and measures for a while from the server's own metrics: frames detected per
stream per second, frames dropped, and the glass-to-result latency (capture to result
published). A count keeps up when every stream gets at least 95% of its target rate.

    scripts/bench-video.py --bin target/release/peregrine --clip ../shared/videos/bigbuckbunny.mp4 \\
        --fps 5 --streams 2,3,4 [--seconds 15] [--no-tracking] [--decoder nvdec] [--in-flight 2] \\
        [-- extra serve flags]

The table also gives the server's CPU use (cores, from /proc) and, with --decoder, how many
streams the server says decode on NVDEC (`peregrine_stream_decoder`). On stderr, per count:
the window's drops by reason, the share of results over 100 ms (exact, from the bucket
edge), and the engine's queue, preprocess and inference P50 / P99.

Standard library only, so it runs wherever the binary does.
"""

import argparse
import json
import math
import os
import re
import sys
import time
import urllib.request

import peregrine_server

CLIP_FPS = 25.0


GLASS = "peregrine_stream_glass_to_result_seconds"
# The engine's histograms whose window figures go to stderr beside the table: where a
# frame's time went once it reached the detector.
STAGES = ("peregrine_queue_seconds", "peregrine_preprocess_seconds", "peregrine_inference_seconds")


def metrics(base, save=None):
    """The stream counters and every histogram's buckets (summed over labels) of /metrics
    (also written raw to `save`). The glass-to-result buckets are `hists[GLASS]`."""
    raw = urllib.request.urlopen(base + "/metrics", timeout=10).read()
    if save:
        with open(save, "wb") as f:
            f.write(raw)
    text = raw.decode()
    counters, hists = {}, {}
    for line in text.splitlines():
        m = re.match(r'^(peregrine_\w+)\{([^}]*)\} ([0-9.e+-]+|\+Inf)$', line)
        if not m:
            continue
        name, labels, value = m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2))), float(m.group(3))
        if name.endswith("_bucket"):
            le = math.inf if labels["le"] == "+Inf" else float(labels["le"])
            h = hists.setdefault(name[:-len("_bucket")], {})
            h[le] = h.get(le, 0) + value
        elif not name.startswith("peregrine_stream_"):
            continue
        elif name == "peregrine_stream_decoder":
            key = (name, labels.get("stream"), labels.get("decoder"))
            counters[key] = value
        elif name.endswith("_total"):
            key = (name, labels.get("stream"), labels.get("reason"))
            counters[key] = counters.get(key, 0) + value
    return counters, hists


def total(c, name, stream=None, reason=None):
    return sum(v for (n, s, r), v in c.items()
               if n == name and (stream is None or s == stream) and (reason is None or r == reason))


def dropped_by_reason(before, after, window):
    """Frames dropped per second in the window, by the server's reason, largest first."""
    name = "peregrine_stream_frames_dropped_total"
    reasons = {r for (n, _, r) in after if n == name}
    rates = {r: (total(after, name, reason=r) - total(before, name, reason=r)) / window for r in reasons}
    return ", ".join(f"{r} {v:.1f}" for r, v in sorted(rates.items(), key=lambda kv: -kv[1]) if v > 0)


def cpu_seconds(pid):
    """A process's user + system CPU time (Linux's /proc; USER_HZ is 100)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0


def share_over(before, after, bound):
    """The share of the window's observations above the bucket edge `bound` (exact, unlike
    an interpolated quantile)."""
    n = after.get(math.inf, 0) - before.get(math.inf, 0)
    within = after.get(bound, 0) - before.get(bound, 0)
    return (n - within) / n if n > 0 else float("nan")


def stages(before, after):
    """The window's P50 / P99 of each engine stage, in ms, as one line."""
    parts = []
    for name in STAGES:
        b, a = before.get(name, {}), after.get(name, {})
        if a:
            short = name[len("peregrine_"):-len("_seconds")]
            parts.append(f"{short} {quantile(b, a, 0.5) * 1e3:.1f} / {quantile(b, a, 0.99) * 1e3:.1f}")
    return ", ".join(parts)


def quantile(before, after, q):
    edges = sorted(after)
    cum = [(le, after[le] - before.get(le, 0)) for le in edges]
    n = cum[-1][1] if cum else 0
    if n <= 0:
        return float("nan")
    prev_le, prev_c = 0.0, 0.0
    for le, c in cum:
        if c >= q * n:
            if le == math.inf:
                return prev_le
            return prev_le + (le - prev_le) * (q * n - prev_c) / max(c - prev_c, 1e-9)
        prev_le, prev_c = le, c
    return prev_le


def save_profile(base, directory, n, seconds):
    """Records the server's CPU for `seconds` as a flame graph (the measured window)."""
    url = f"{base}/debug/pprof/profile?seconds={max(1, round(seconds))}&format=svg"
    with open(os.path.join(directory, f"profile-{n}.svg"), "wb") as f:
        f.write(urllib.request.urlopen(url, timeout=seconds + 60).read())


def post(base, body):
    req = urllib.request.Request(base + "/v1/streams", data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    urllib.request.urlopen(req, timeout=60).read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--clip", required=True)
    ap.add_argument("--fps", type=float, required=True, help="detections per second per stream; 0: every frame")
    ap.add_argument("--streams", required=True, help="comma-separated counts, ascending")
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--settle", type=float, default=5)
    ap.add_argument("--no-tracking", action="store_true",
                    help="streams without analytics (no tracker, zones or events), to price them")
    ap.add_argument("--decoder", choices=["auto", "cpu", "nvdec"],
                    help="each stream's decoder (default: the server's --video-decoder)")
    ap.add_argument("--in-flight", type=int,
                    help="each stream's detect_in_flight (default: the stream default, 1)")
    ap.add_argument("--profile", metavar="DIR",
                    help="save each count's /metrics and a CPU flame graph of its measured window in DIR "
                         "(give the server --profiling true)")
    ap.add_argument("serve_args", nargs="*")
    a = ap.parse_args()
    if a.profile:
        os.makedirs(a.profile, exist_ok=True)
    target = a.fps if a.fps > 0 else CLIP_FPS
    proc, base = peregrine_server.start(a.bin, a.clip, a.serve_args)
    mode = f"{a.fps:g} fps" if a.fps > 0 else "every frame"
    print(f"| streams | mode | detected / s per stream (min, mean) | dropped / s | glass-to-result P50 / P99 ms | CPU cores (per stream) | on NVDEC | keeps up |")
    print("|---|---|---|---|---|---|---|---|")
    running = 0
    try:
        for n in [int(x) for x in a.streams.split(",")]:
            while running < n:
                running += 1
                body = {"name": f"cam{running}", "url": a.clip, "loop": True, "realtime": True,
                        "staleness_ms": 1000, "frame_pool": 6}
                if a.fps > 0:
                    body["fps"] = a.fps
                if a.no_tracking:
                    body["analytics"] = {"tracking": False}
                if a.decoder:
                    body["decoder"] = a.decoder
                if a.in_flight:
                    body["detect_in_flight"] = a.in_flight
                post(base, body)
            time.sleep(a.settle)
            c0, h0 = metrics(base, a.profile and os.path.join(a.profile, f"metrics-{n}-start.txt"))
            cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
            if a.profile:
                # The profile's request and its rendering make the window a little longer
                # than asked: rates below divide by the window as measured.
                save_profile(base, a.profile, n, a.seconds)
            else:
                time.sleep(a.seconds)
            c1, h1 = metrics(base, a.profile and os.path.join(a.profile, f"metrics-{n}.txt"))
            b0, b1 = h0.get(GLASS, {}), h1.get(GLASS, {})
            window = time.monotonic() - t0
            cores = (cpu_seconds(proc.pid) - cpu0) / window
            on_nvdec = sum(1 for (n, _, d), v in c1.items() if n == "peregrine_stream_decoder" and d == "nvdec" and v == 1)
            rates = [(total(c1, "peregrine_stream_frames_detected_total", f"cam{i}")
                      - total(c0, "peregrine_stream_frames_detected_total", f"cam{i}")) / window
                     for i in range(1, n + 1)]
            dropped = (total(c1, "peregrine_stream_frames_dropped_total")
                       - total(c0, "peregrine_stream_frames_dropped_total")) / window
            p50, p99 = quantile(b0, b1, 0.5) * 1e3, quantile(b0, b1, 0.99) * 1e3
            ok = min(rates) >= 0.95 * target
            print(f"| {n} | {mode} | {min(rates):.2f}, {sum(rates) / n:.2f} | {dropped:.1f} | {p50:.0f} / {p99:.0f} | {cores:.2f} ({cores / n:.3f}) | {on_nvdec} | {'yes' if ok else 'no'} |",
                  flush=True)
            by_reason = dropped_by_reason(c0, c1, window)
            # Outside the table (stderr), so that its rows stay pasteable.
            if by_reason:
                print(f"{n} streams, dropped / s by reason: {by_reason}", file=sys.stderr, flush=True)
            print(f"{n} streams, glass-to-result over 100 ms: {share_over(b0, b1, 0.1):.2%}; "
                  f"engine P50 / P99 ms: {stages(h0, h1)}", file=sys.stderr, flush=True)
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()

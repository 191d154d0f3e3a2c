#!/usr/bin/env python3
"""Adds N looped file streams to a running `peregrine serve`, lets them decode, removes them,
and repeats: GPU memory (NVML's `peregrine_gpu_memory_used_bytes`) and the server's threads
and resident memory before, with the streams, and after each removal. Decoders (NVDEC
sessions included) must be closed when a stream is removed, so each round ends where it
started.

    scripts/stream-churn.py --bin target/release/peregrine --clip clip.mp4 [--count 100]
        [--rounds 2] [--decoder nvdec] [-- extra serve flags]

Standard library only, so it runs wherever the binary does.
"""

import argparse
import json
import re
import time
import urllib.request

import peregrine_server


def request(base, path, method="GET", body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"content-type": "application/json"})
    return urllib.request.urlopen(req, timeout=60).read().decode()


def gpu_memory_mib(base):
    text = request(base, "/metrics")
    values = [float(m.group(1)) for m in re.finditer(r'^peregrine_gpu_memory_used_bytes\{[^}]*\} (\S+)$', text, re.M)]
    return sum(values) / 2**20 if values else float("nan")


def process(pid):
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    return int(status["Threads"]), int(status["VmRSS"].split()[0]) // 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--clip", required=True)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--decoder", choices=["auto", "cpu", "nvdec"])
    ap.add_argument("--streaming-seconds", type=float, default=5)
    ap.add_argument("serve_args", nargs="*")
    a = ap.parse_args()
    proc, base = peregrine_server.start(a.bin, a.clip, a.serve_args)
    print("| round | moment | GPU memory used, MiB | server threads | server RSS, MiB | streams on NVDEC |")
    print("|---|---|---|---|---|---|")

    def row(r, moment, on_nvdec=""):
        threads, rss = process(proc.pid)
        print(f"| {r} | {moment} | {gpu_memory_mib(base):.0f} | {threads} | {rss} | {on_nvdec} |", flush=True)

    try:
        row(0, "ready, no streams")
        for r in range(1, a.rounds + 1):
            names = [f"churn{r}-{i}" for i in range(a.count)]
            for name in names:
                body = {"name": name, "url": a.clip, "loop": True, "realtime": True, "fps": 5}
                if a.decoder:
                    body["decoder"] = a.decoder
                request(base, "/v1/streams", "POST", body)
            # A decoder shows as active from its first picture: wait until every stream has
            # one (a hundred decoders opening at once take seconds), then let them run.
            posted = time.time()
            while True:
                decoders = [json.loads(request(base, f"/v1/streams/{n}"))["decoder"]["active"] for n in names]
                if all(decoders) or time.time() - posted > 60:
                    break
                time.sleep(0.5)
            opened = time.time() - posted
            time.sleep(a.streaming_seconds)
            decoders = [json.loads(request(base, f"/v1/streams/{n}"))["decoder"]["active"] for n in names]
            row(r, f"{a.count} streams decoding (all open after {opened:.1f} s)",
                sum(1 for d in decoders if d == "nvdec"))
            for name in names:
                request(base, f"/v1/streams/{name}", "DELETE")
            time.sleep(2)
            row(r, "all removed")
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()

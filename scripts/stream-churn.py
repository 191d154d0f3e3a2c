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
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request


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
    roots = os.path.dirname(os.path.abspath(a.clip))
    proc = subprocess.Popen([a.bin, "serve", "--host", "127.0.0.1", "--port", "0", "--allow-grpc", "false",
                             "--log-level", "warn", "--stream-file-roots", roots, *a.serve_args],
                            stderr=subprocess.PIPE, text=True)
    base = None
    for line in proc.stderr:
        m = re.match(r"peregrine: listening on (http://\S+)", line)
        if m:
            base = m.group(1)
            break
    if base is None:
        sys.exit("the server did not start")
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    deadline = time.time() + 300
    while True:
        try:
            if urllib.request.urlopen(base + "/health/ready", timeout=2).status == 200:
                break
        except OSError:
            pass
        if time.time() > deadline or proc.poll() is not None:
            sys.exit("the server did not become ready")
        time.sleep(0.2)
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
            time.sleep(a.streaming_seconds)
            decoders = [json.loads(request(base, f"/v1/streams/{n}"))["decoder"]["active"] for n in names]
            row(r, f"{a.count} streams decoding", sum(1 for d in decoders if d == "nvdec"))
            for name in names:
                request(base, f"/v1/streams/{name}", "DELETE")
            time.sleep(2)
            row(r, "all removed")
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()

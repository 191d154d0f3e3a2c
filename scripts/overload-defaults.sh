#!/usr/bin/env bash
# Issue 22's overload scenario with the server's defaults, driven by a load generator written
# elsewhere (`hey`, Debian's package): closed-loop capacity first (`hey -c 8`), then
# `hey -z DURATION -c 48 -q 1` posting one photo (about 3x capacity on 2 cores). Prints the
# answers by status, late 504s as a share of all requests, latency percentiles per status,
# 200s per second against the capacity, and resident memory idle and at peak.
#
#   [PEREGRINE_BIN=path] [PEREGRINE_SERVE_ARGS="--max-batch 2"] [SERVER_CPUS=0 CLIENT_CPUS=1] \
#       scripts/overload-defaults.sh [DURATION_S=120] [OUT_DIR=target/overload-defaults]
#
# PEREGRINE_SERVE_ARGS adds flags to the server's (for A/B runs of one setting).
# SERVER_CPUS and CLIENT_CPUS (taskset lists, e.g. 0 and 1) keep the server and `hey` on
# cores of their own, so that the load generator's bursts do not wait for the model's
# cores (docs/benchmarks.md, "One margin before decoding, another after"); give the
# server the matching `--threads` in PEREGRINE_SERVE_ARGS. Resident
# memory is sampled every second; smaps_rollup at the peak says how much of it is anonymous
# memory (heap, arenas, pools) and how much is mapped files (the binary, ONNX Runtime).
#
# Traffic goes to 127.0.0.1 only.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
duration="${1:-120}"
out="${2:-target/overload-defaults}"
bin="${PEREGRINE_BIN:-target/release/peregrine}"
port="${PEREGRINE_OVERLOAD_PORT:-18092}"
image="${PEREGRINE_OVERLOAD_IMAGE:-../shared/images/bus.jpg}"
command -v hey >/dev/null || { echo "needs hey (apt-get install hey)" >&2; exit 2; }
mkdir -p "$out"
[ -x "$bin" ] || cargo build --release --locked

server_pin=() client_pin=()
[ -n "${SERVER_CPUS:-}" ] && server_pin=(taskset -c "$SERVER_CPUS")
[ -n "${CLIENT_CPUS:-}" ] && client_pin=(taskset -c "$CLIENT_CPUS")

# shellcheck disable=SC2086 # PEREGRINE_SERVE_ARGS is a list of flags.
"${server_pin[@]}" "$bin" serve --host 127.0.0.1 --port "$port" --request-timeout-ms 2000 --log-level warn \
    ${PEREGRINE_SERVE_ARGS:-} 2>"$out/server.log" &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do
    curl -fs "http://127.0.0.1:$port/health/ready" >/dev/null 2>&1 && break
    sleep 0.5
done
curl -fs "http://127.0.0.1:$port/health/ready" >/dev/null
rss() { awk '/^VmRSS/ {print $2}' "/proc/$server/status"; }
idle_kb=$(rss)
url="http://127.0.0.1:$port/v1/detect"
"${client_pin[@]}" hey -z 20s -c 8 -m POST -T image/jpeg -D "$image" -o csv "$url" >"$out/capacity.csv"
peak_kb=$idle_kb
rm -f "$out/peak_kb"
( while kill -0 "$server" 2>/dev/null; do
    kb=$(rss)
    echo "$kb"
    if [ "$kb" -gt "$(cat "$out/peak_kb" 2>/dev/null || echo 0)" ]; then
        echo "$kb" >"$out/peak_kb"
        cat "/proc/$server/smaps_rollup" >"$out/smaps_at_peak.txt" 2>/dev/null || true
    fi
    sleep 1
done ) >"$out/rss.txt" &
sampler=$!
"${client_pin[@]}" hey -z "${duration}s" -c 48 -q 1 -m POST -T image/jpeg -D "$image" -o csv "$url" >"$out/overload.csv"
kill "$sampler" 2>/dev/null || true
peak_kb=$(sort -n "$out/rss.txt" | tail -1)
# Where the server refused (before the body, before or after decoding, queue full, no
# permit left), and how long its own handler took over refusals: the server's side of
# the 429s' latency, apart from what the client and the network add.
curl -fs "http://127.0.0.1:$port/metrics" >"$out/metrics.txt" || true

python3 - "$out" "$duration" "$idle_kb" "$peak_kb" <<'PY'
import csv, json, os, sys
out, duration, idle_kb, peak_kb = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def rows(name):
    with open(f"{out}/{name}") as f:
        return [(int(r["status-code"]), float(r["response-time"]) * 1e3) for r in csv.DictReader(f)]

def pct(xs, q):
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))], 1) if xs else None

capacity = sum(1 for s, _ in rows("capacity.csv") if s == 200) / 20.0
load = rows("overload.csv")
by = {}
for s, ms in load:
    by.setdefault(s, []).append(ms)
ok = len(by.get(200, []))
summary = {
    "capacity_rps": round(capacity, 2),
    "requests": len(load),
    "by_status": {str(s): len(v) for s, v in sorted(by.items())},
    "late_504_share": round(len(by.get(504, [])) / max(1, len(load)), 4),
    "latency_ms": {str(s): {"p50": pct(v, 0.5), "p99": pct(v, 0.99), "max": pct(v, 1.0)} for s, v in sorted(by.items())},
    "ok_rps": round(ok / duration, 2),
    "ok_rps_over_capacity": round(ok / duration / capacity, 3) if capacity else None,
    "rss_mib": {"idle": round(idle_kb / 1024), "peak": round(peak_kb / 1024)},
}
try:
    rollup = {}
    for line in open(f"{out}/smaps_at_peak.txt"):
        parts = line.split()
        if len(parts) == 3 and parts[2] == "kB":
            rollup[parts[0].rstrip(":")] = int(parts[1])
    summary["rss_mib"]["peak_anonymous"] = round(rollup.get("Anonymous", 0) / 1024)
    summary["rss_mib"]["peak_files"] = round((rollup.get("Rss", 0) - rollup.get("Anonymous", 0)) / 1024)
except OSError:
    pass
refusals, handler = {}, {}
for line in open(f"{out}/metrics.txt", errors="replace") if os.path.exists(f"{out}/metrics.txt") else []:
    if line.startswith("peregrine_refusals_total{"):
        stage = line.split('stage="', 1)[1].split('"', 1)[0]
        refusals[stage] = refusals.get(stage, 0) + int(float(line.split()[-1]))
    if line.startswith("peregrine_request_seconds_bucket{") and 'outcome="rejected"' in line:
        le = line.split('le="', 1)[1].split('"', 1)[0]
        if le in ("0.001", "0.01", "+Inf"):
            handler[le] = int(float(line.split()[-1]))
# Counted since the server started, so the capacity run (8 clients, few if any refused) is in.
summary["refusals_by_stage"] = refusals
if handler.get("+Inf"):
    total = handler["+Inf"]
    summary["refusals_in_handler_within"] = {
        "1ms": round(handler.get("0.001", 0) / total, 4),
        "10ms": round(handler.get("0.01", 0) / total, 4),
    }
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(json.dumps(summary, indent=2))
PY

#!/usr/bin/env bash
# 3x overload with and without a fallback model (issue 14), on one server:
#
#   scripts/fallback-overload.sh BIN MODEL IMAGES_DIR OUT_DIR [DURATION_S=120]
#
# Builds a repository of two models from MODEL's weights: `det` at 640x640 with a 1 s
# objective and `fallback = "small"`, and `small` at 320x320. Measures det's capacity
# alone (closed loop, concurrency 8, `fallback=false`, 20 s), then sends 3x that rate to
# det for DURATION_S with `fallback=false` and again with the fallback allowed, a 2 s
# deadline on every request. Writes OUT_DIR/{capacity,without,with}.json, the fallback
# counters (fallbacks.txt) and summary.txt: how many requests of each run were answered
# (within their deadline: later ones are 504s), refused, or late. Traffic goes to
# 127.0.0.1 only.
set -euo pipefail
bin="$1"
model="$2"
images="$3"
out="$4"
duration="${5:-120}"
port="${PORT:-18095}"
url="http://127.0.0.1:$port"
mkdir -p "$out"
repo="$out/repo"
rm -rf "$repo"
mkdir -p "$repo/det/1" "$repo/small/1"
cp "$model" "$repo/det/1/model.onnx"
cp "$model" "$repo/small/1/model.onnx"
printf 'imgsz = [640, 640]\nfallback = "small"\n[slo]\np99_ms = 1000\nadaptive_batching = false\n' >"$repo/det/config.toml"
printf 'imgsz = [320, 320]\n' >"$repo/small/config.toml"
"$bin" serve --model-repository "$repo" --host 127.0.0.1 --port "$port" --max-batch 4 --queue-capacity 16 \
    --max-in-flight 24 --request-timeout-ms 2000 --log-level warn 2>"$out/server.log" &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do
    curl -fs "$url/health/ready" >/dev/null 2>&1 && break
    sleep 0.5
done
curl -fs "$url/health/ready" >/dev/null
"$bin" bench "$images" --url "$url" --query "model=det&fallback=false" --concurrency 8 --duration 20 \
    --output "$out/capacity.json" >/dev/null
rate=$(python3 -c "import json,sys;print(round(3*json.load(open(sys.argv[1]))['throughput_rps'],2))" "$out/capacity.json")
for run in without with; do
    query="model=det"
    [ "$run" = without ] && query="model=det&fallback=false"
    "$bin" bench "$images" --url "$url" --query "$query" --rate "$rate" --duration "$duration" \
        --deadline-ms 2000 --output "$out/$run.json" >/dev/null
    curl -s "$url/metrics" | grep '^peregrine_fallbacks_total' >"$out/fallbacks-after-$run.txt" || true
done
alive=no
curl -fs "$url/health/live" >/dev/null && alive=yes
python3 - "$out" "$rate" "$duration" "$alive" <<'PY' | tee "$out/summary.txt"
import json, sys
out, rate, duration, alive = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
cap = json.load(open(f"{out}/capacity.json"))["throughput_rps"]
print(f"det alone: {cap:.2f} req/s; 3x = {rate} req/s for {duration} s, 2 s deadline; server alive after: {alive}")
for run in ("without", "with"):
    r = json.load(open(f"{out}/{run}.json"))
    e = r["errors"]
    n = r["requests"]
    ok = r["successes"]
    print(f"{run} fallback: {n} requests, answered {ok} ({100 * ok / max(n, 1):.1f}%), "
          f"429 {e.get('http_429', 0)}, 504 {e.get('http_504', 0)}, other {sum(v for k, v in e.items() if k not in ('http_429', 'http_504'))}; "
          f"answered/s {r['throughput_rps']:.2f}, P50 {r['latency_ms']['p50']:.0f} ms, P99 {r['latency_ms']['p99']:.0f} ms")
for line in open(f"{out}/fallbacks-after-with.txt"):
    print("  " + line.strip())
PY

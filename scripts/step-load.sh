#!/usr/bin/env bash
# Step-load curves of static and adaptive batching (issue 14), on this machine:
#
#   scripts/step-load.sh BIN MODEL IMAGES_DIR OUT_DIR
#
# Measures capacity first (closed loop, CAP_CONCURRENCY clients, 20 s) with the first
# configuration, then sends the same open-loop profile to every configuration:
# 20% -> 90% -> 150% -> 20% of that capacity, STEP_S seconds each (`peregrine bench
# --profile`). CONFIGS is ";"-separated "label serve-flags"; BASE_FLAGS go to every server.
# Writes OUT_DIR/<label>.json (one report per step), <label>.metrics (the batch limit,
# adjustments and P99 gauges at the end) and summary.txt (a table of the steps).
set -euo pipefail
bin="$1"
model="$2"
images="$3"
out="$4"
mkdir -p "$out"
port="${PORT:-18181}"
step_s="${STEP_S:-20}"
cap_concurrency="${CAP_CONCURRENCY:-8}"
base_flags="${BASE_FLAGS:-}"
configs="${CONFIGS:-static1 --max-batch 1;static4 --max-batch 4 --max-queue-delay-us 4000;adaptive --max-batch 4 --max-queue-delay-us 4000 --slo-p99-ms 400 --slo-window-s 5}"
url="http://127.0.0.1:$port"

serve() {
    # shellcheck disable=SC2086
    "$bin" serve --model "$model" --host 127.0.0.1 --port "$port" --log-level warn $base_flags "$@" \
        >>"$out/server.log" 2>&1 &
    server=$!
    for _ in $(seq 1 240); do
        curl -fs "$url/health/ready" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    echo "server not ready: $*" >&2
    return 1
}
stop() { kill -TERM "$server" 2>/dev/null; wait "$server" 2>/dev/null || true; }

IFS=';' read -r -a variants <<<"$configs"
read -r -a first <<<"${variants[0]}"
serve "${first[@]:1}"
"$bin" bench "$images" --url "$url" --concurrency "$cap_concurrency" --duration 20 --output "$out/capacity.json" >/dev/null
stop
capacity=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['throughput_rps'])" "$out/capacity.json")
profile=$(python3 -c "
import sys
c, s = float(sys.argv[1]), sys.argv[2]
print(','.join(f'{round(c * p, 1)}:{s}' for p in (0.2, 0.9, 1.5, 0.2)))" "$capacity" "$step_s")
{
    echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores$(command -v nvidia-smi >/dev/null && echo ", $(nvidia-smi --query-gpu=name --format=csv,noheader)"), $(date -u +%FT%TZ)"
    echo "capacity (closed loop, concurrency $cap_concurrency, ${first[0]}): $capacity req/s; profile $profile"
} >"$out/summary.txt"
for v in "${variants[@]}"; do
    read -r -a words <<<"$v"
    label="${words[0]}"
    serve "${words[@]:1}"
    "$bin" bench "$images" --url "$url" --profile "$profile" --deadline-ms 10000 --output "$out/$label.json" >/dev/null
    curl -s "$url/metrics" | grep -E '^peregrine_(batch_limit|batch_adjustments_total|latency_p99_seconds)' >"$out/$label.metrics" || true
    stop
    python3 - "$out/$label.json" "$label ${words[*]:1}" >>"$out/summary.txt" <<'PY'
import json, sys
print(f"== {sys.argv[2]}")
for s in json.load(open(sys.argv[1]))["steps"]:
    l = s["latency_ms"]
    refused = sum(v for k, v in s["errors"].items() if k == "http_429")
    other = sum(v for k, v in s["errors"].items() if k != "http_429")
    print(f"rate {s['rate']:8.1f}  answered/s {s['throughput_rps']:8.2f}  p50 {l['p50']:8.1f}  p99 {l['p99']:8.1f}  429 {refused}  other errors {other}")
PY
    sed 's/^/   /' "$out/$label.metrics" >>"$out/summary.txt"
done
cat "$out/summary.txt"

#!/usr/bin/env bash
# Serving benchmarks on this machine. The VM's speed drifts by tens of percent within
# minutes, so each comparison interleaves rounds: the model alone, then the server, three
# times, and compares each server round with the model rounds around it.
#
#   [PEREGRINE_BIN=path] scripts/bench-serving.sh [SECONDS_PER_ROUND=10] [OUT_DIR=target/bench-serving]
#
# Scenarios: batch 1 (no batching) and max batch 4 (2 ms window), each at concurrency 8
# against the model alone at the same batch size and threads; then concurrency 1 for the
# server's own overhead. Writes JSON per round and summary.json.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
seconds="${1:-10}"
out="${2:-target/bench-serving}"
images="${PEREGRINE_BENCH_IMAGES:-../shared/images}"
port="${PEREGRINE_BENCH_PORT:-18091}"
bin="${PEREGRINE_BIN:-target/release/peregrine}"  # another build to compare: PEREGRINE_BIN=path
rounds=3
mkdir -p "$out"
[ -x "$bin" ] || cargo build --release --locked

start_server() { # name, serve flags...
    local name=$1; shift
    "$bin" serve --host 127.0.0.1 --port "$port" --log-level warn "$@" 2>"$out/$name-server.log" &
    server=$!
    for _ in $(seq 1 240); do
        curl -fs "http://127.0.0.1:$port/health/ready" >/dev/null 2>&1 && return
        sleep 0.5
    done
    echo "server $name did not become ready" >&2
    exit 1
}
stop_server() { kill -TERM "$server"; wait "$server" || true; }
client() { # output, bench flags...
    local file=$1; shift
    "$bin" bench --url "http://127.0.0.1:$port" --duration "$seconds" --output "$file" "$@" "$images" >/dev/null
}

for batch in 1 4; do
    name="batch$batch"
    if [ "$batch" = 1 ]; then flags=(--max-batch 1 --max-queue-delay-us 0); else flags=(--max-batch 4 --max-queue-delay-us 2000); fi
    start_server "$name" "${flags[@]}"
    for r in $(seq 1 $rounds); do
        echo "== $name round $r: model alone, then server at concurrency 8" >&2
        "$bin" bench-model --batch "$batch" --seconds "$seconds" --output "$out/$name-model-$r.json" "$images" >/dev/null
        client "$out/$name-server-$r.json" --concurrency 8
    done
    "$bin" bench-model --batch "$batch" --seconds "$seconds" --output "$out/$name-model-$((rounds + 1)).json" "$images" >/dev/null
    echo "== $name: concurrency 1" >&2
    client "$out/$name-c1.json" --concurrency 1
    stop_server
done

python3 - "$out" "$rounds" <<'PY'
import json, sys, statistics
out, rounds = sys.argv[1], int(sys.argv[2])
summary = {}
for batch in (1, 4):
    name = f"batch{batch}"
    model = [json.load(open(f"{out}/{name}-model-{r}.json"))[0]["images_per_s"] for r in range(1, rounds + 2)]
    server = [json.load(open(f"{out}/{name}-server-{r}.json")) for r in range(1, rounds + 1)]
    ratios = [s["throughput_rps"] / ((model[i] + model[i + 1]) / 2) for i, s in enumerate(server)]
    c1 = json.load(open(f"{out}/{name}-c1.json"))
    summary[name] = {
        "model_images_per_s": [round(m, 2) for m in model],
        "server_c8_rps": [round(s["throughput_rps"], 2) for s in server],
        "server_over_model": [round(x, 3) for x in ratios],
        "server_over_model_median": round(statistics.median(ratios), 3),
        "c8_latency_p50_ms": [s["latency_ms"]["p50"] for s in server],
        "c8_latency_p99_ms": [s["latency_ms"]["p99"] for s in server],
        "c1_rps": round(c1["throughput_rps"], 2),
        "c1_latency_p50_ms": c1["latency_ms"]["p50"],
        "c1_server_ms": c1["server_ms"],
    }
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(json.dumps(summary, indent=2))
PY

#!/usr/bin/env bash
# What online calibration costs serving (issue 18: "nothing about it may slow serving while
# it runs"), side by side on one machine:
#
#   scripts/online-calibration-cost.sh BIN MODEL.onnx IMAGE_DIR
#
# ROUNDS rounds (default 3); in each, a fresh one-model repository is served twice, once
# plain and once with `calibration = { mode = "online", samples = SAMPLES }` (default
# 500), and `BIN bench` loads each for SECONDS_EACH (default 15) at each concurrency of
# CONCURRENCIES (default "1 4": one request at a time leaves cores idle, which the
# calibration thread may use; four saturate the machine). The calibration is still
# sampling or running when each measurement ends (the script prints how far it got), so
# the figures are serving while it runs, not after. Prints one line per measurement and
# the median ratio (with calibration / without) per concurrency.
set -euo pipefail
bin="$1"
model="$2"
images="$3"
rounds="${ROUNDS:-3}"
seconds="${SECONDS_EACH:-15}"
samples="${SAMPLES:-500}"
concurrencies="${CONCURRENCIES:-1 4}"
port=18500
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores"
echo "date: $(date -u +%FT%TZ); $seconds s per figure, calibration of $samples samples"

serve_and_bench() { # name round
    local repo="$out/repo-$1-$2"
    mkdir -p "$repo/m/1"
    cp "$model" "$repo/m/1/model.onnx"
    if [ "$1" = calibrating ]; then
        echo "calibration = { mode = \"online\", samples = $samples }" >"$repo/m/config.toml"
    fi
    "$bin" serve --model-repository "$repo" --host 127.0.0.1 --port "$port" --grpc-port $((port + 1)) \
        --log-level info >"$out/log-$1-$2" 2>&1 &
    local server=$!
    for _ in $(seq 1 240); do
        curl -fs "http://127.0.0.1:$port/health/ready" >/dev/null 2>&1 && break
        kill -0 "$server" 2>/dev/null || { echo "the server exited before it was ready" >&2; exit 1; }
        sleep 0.5
    done
    for c in $concurrencies; do
        "$bin" bench --url "http://127.0.0.1:$port" --concurrency "$c" --duration "$seconds" \
            --output "$out/bench-$1-$2-$c.json" "$images"/* >/dev/null 2>&1 || echo "bench failed (rc $?)"
        python3 -c "import json,sys;r=json.load(open(sys.argv[1]));print('serving', sys.argv[2], 'round', sys.argv[3], 'concurrency', sys.argv[4], round(r['throughput_rps'],2), 'req/s, p50', r['latency_ms']['p50'], 'ms, p99', r['latency_ms']['p99'], 'ms, errors', r['errors'])" \
            "$out/bench-$1-$2-$c.json" "$1" "$2" "$c"
    done
    if [ "$1" = calibrating ]; then
        local seen
        seen=$(grep -oE '(seen=|"seen":)[0-9]+' "$out/log-$1-$2" | tail -1 | grep -oE '[0-9]+$' || true)
        echo "  calibration by then: ${seen:-fewer than a tenth of the} samples run; $(grep -c 'online calibration done' "$out/log-$1-$2" || true) published"
    fi
    kill -TERM "$server"
    wait "$server" 2>/dev/null || true
}

for round in $(seq 1 "$rounds"); do
    serve_and_bench plain "$round"
    serve_and_bench calibrating "$round"
done | tee "$out/lines"

python3 - "$out/lines" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    w = line.split()
    if w[0] == 'serving':
        rows.setdefault((w[5], w[3]), {})[w[1]] = (float(w[6]), float(w[12]))
for c in sorted({c for c, _ in rows}, key=int):
    pairs = [v for (cc, _), v in rows.items() if cc == c and 'plain' in v and 'calibrating' in v]
    rps = [v['calibrating'][0] / v['plain'][0] for v in pairs]
    p99 = [v['calibrating'][1] / v['plain'][1] for v in pairs]
    print(f'concurrency {c}: with calibration / without, throughput median {statistics.median(rps):.3f}x '
          f'(rounds: {", ".join(f"{r:.3f}" for r in rps)}), p99 median {statistics.median(p99):.3f}x')
EOF

#!/usr/bin/env bash
# INT8 against float32 on the CPU provider, side by side on one machine (issue 18's
# targets: model alone >= 2.0x at batch 1 and 4, end to end >= 1.7x):
#
#   scripts/int8-speed.sh BIN FLOAT.onnx INT8.onnx IMAGE_DIR
#
# (FLOAT `embedded`: the binary's own YOLO11n.)
# ROUNDS rounds (default 3); in each, every model runs in turn, so a change in the
# machine's load falls on both: `BIN bench-model` at batch 1 and 4 for SECONDS (default
# 4) with THREADS intra-op threads (default 0: one per core), then `BIN serve` with the
# defaults (and THREADS) loaded by `BIN bench` at concurrency CONCURRENCY (default 2 x
# cores) for SECONDS x 2 over IMAGE_DIR's photos. Prints one line per measurement and the
# median of the per-round ratios. Records the processor and its INT8 instructions first.
# EXTRA_FLAGS adds flags to both commands, e.g. `--graph-rewrite off` to run the models as
# exported (without the CPU's DFL fold).
set -euo pipefail
bin="$1"
float="$2"
int8="$3"
images="$4"
rounds="${ROUNDS:-3}"
seconds="${SECONDS_EACH:-4}"
threads="${THREADS:-0}"
read -r -a extra <<<"${EXTRA_FLAGS:-}"
cores=$(nproc)
concurrency="${CONCURRENCY:-$((2 * cores))}"
port=18400
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $cores cores;" \
    "int8 instructions: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' |
        grep -E '^(avx2|avx512f|avx512_vnni|avx_vnni|amx_int8|amx_tile)$' | xargs)"
echo "date: $(date -u +%FT%TZ); threads $threads, concurrency $concurrency, $seconds s per figure; extra flags: ${extra[*]:-none}"

model_flag() { # path
    [ "$1" = embedded ] || echo "--model $1"
}

model_alone() { # name path round
    # shellcheck disable=SC2046
    "$bin" bench-model $(model_flag "$2") "${extra[@]}" --threads "$threads" --batch 1,4 --seconds "$seconds" \
        --output "$out/model-$1-$3.json" "$images" >/dev/null 2>&1
    python3 -c "import json,sys;[print('model-alone', sys.argv[1], 'round', sys.argv[2], 'batch', f['batch'], round(f['images_per_s'],2), 'img/s') for f in json.load(open(sys.argv[3]))]" \
        "$1" "$3" "$out/model-$1-$3.json"
}

end_to_end() { # name path round
    # shellcheck disable=SC2046
    "$bin" serve $(model_flag "$2") "${extra[@]}" --threads "$threads" --host 127.0.0.1 --port "$port" --grpc-port $((port + 1)) \
        --log-level warn &
    local server=$!
    for _ in $(seq 1 240); do
        curl -fs "http://127.0.0.1:$port/health/ready" >/dev/null 2>&1 && break
        kill -0 "$server" 2>/dev/null || { echo "the server exited before it was ready" >&2; exit 1; }
        sleep 0.5
    done
    "$bin" bench --url "http://127.0.0.1:$port" --concurrency "$concurrency" --duration $((seconds * 2)) \
        --output "$out/e2e-$1-$3.json" "$images"/* >/dev/null 2>&1 || echo "bench failed (rc $?)"
    kill -TERM "$server"
    wait "$server" 2>/dev/null || true
    python3 -c "import json,sys;r=json.load(open(sys.argv[3]));print('end-to-end', sys.argv[1], 'round', sys.argv[2], round(r['throughput_rps'],2), 'req/s, p50', r['latency_ms']['p50'], 'ms, errors', r['errors'])" \
        "$1" "$3" "$out/e2e-$1-$3.json"
}

for round in $(seq 1 "$rounds"); do
    for name in float int8; do
        path="$float"
        [ "$name" = int8 ] && path="$int8"
        model_alone "$name" "$path" "$round"
        end_to_end "$name" "$path" "$round"
    done
done | tee "$out/lines"

python3 - "$out/lines" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    w = line.split()
    if w[0] == 'model-alone':
        rows.setdefault((f'model alone, batch {w[5]}', w[3]), {})[w[1]] = float(w[6])
    elif w[0] == 'end-to-end':
        rows.setdefault(('end to end', w[3]), {})[w[1]] = float(w[4])
by_kind = {}
for (kind, _), v in rows.items():
    if 'float' in v and 'int8' in v and v['float'] > 0:
        by_kind.setdefault(kind, []).append(v['int8'] / v['float'])
for kind, ratios in sorted(by_kind.items()):
    print(f'{kind}: int8/float median {statistics.median(ratios):.2f}x (rounds: '
          + ', '.join(f'{r:.2f}' for r in ratios) + ')')
EOF

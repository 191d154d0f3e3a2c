#!/usr/bin/env bash
# What traces cost (issue 14): two servers of the same model side by side, one with
# traces absent (no OTEL_* variable: the default) and one with
# OTEL_EXPORTER_OTLP_ENDPOINT at a local port where nothing listens (every span is made,
# batched and exported in vain), benched in interleaved rounds A, B, A, B, ... so that a
# machine whose load changes (other people compiling) weighs on both alike:
#
#   scripts/trace-cost.sh BIN IMAGES_DIR OUT_DIR [ROUNDS=4] [SECONDS=15] [IMGSZ=320]
#
# Each round is `peregrine bench` closed loop at concurrency 4 for SECONDS. Writes
# OUT_DIR/{absent,on}-N.json and summary.txt: per round, and the ratios on/absent of
# throughput and latency (median of the rounds' ratios). A small IMGSZ keeps the model's
# own time short, so that the per-request cost of tracing shows rather than hides in it.
# Traffic goes to 127.0.0.1 only.
set -euo pipefail
bin="$1"
images="$2"
out="$3"
rounds="${4:-4}"
seconds="${5:-15}"
imgsz="${6:-320}"
port="${PORT:-18096}"
nobody=$((port + 2))
mkdir -p "$out"
# shellcheck source=scripts/bench-servers.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench-servers.sh"
start_server absent "$port"
start_server on $((port + 1)) OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$nobody"

for r in $(seq 1 "$rounds"); do
    for name in absent on; do
        p="$port"
        [ "$name" = on ] && p=$((port + 1))
        "$bin" bench "$images" --url "http://127.0.0.1:$p" --concurrency 4 --duration "$seconds" \
            --output "$out/$name-$r.json" >/dev/null
    done
done
python3 - "$out" "$rounds" "$seconds" "$imgsz" <<'PY' | tee "$out/summary.txt"
import json, statistics, sys
out, rounds, seconds, imgsz = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def load(name, r):
    return json.load(open(f"{out}/{name}-{r}.json"))
print(f"{rounds} rounds of {seconds} s each, closed loop at concurrency 4, {imgsz}x{imgsz}, A = traces absent, B = on (no receiver)")
ratios = {"throughput": [], "p50": [], "p99": []}
for r in range(1, rounds + 1):
    a, b = load("absent", r), load("on", r)
    for key, f in (("throughput", lambda x: x["throughput_rps"]), ("p50", lambda x: x["latency_ms"]["p50"]),
                   ("p99", lambda x: x["latency_ms"]["p99"])):
        ratios[key].append(f(b) / f(a))
    print(f"round {r}: absent {a['throughput_rps']:.2f} req/s P50 {a['latency_ms']['p50']:.1f} ms P99 {a['latency_ms']['p99']:.1f} ms"
          f" | on {b['throughput_rps']:.2f} req/s P50 {b['latency_ms']['p50']:.1f} ms P99 {b['latency_ms']['p99']:.1f} ms"
          f" | errors {sum(a['errors'].values())}/{sum(b['errors'].values())}")
for key, values in ratios.items():
    print(f"on/absent {key}: median {statistics.median(values):.3f} (rounds: {', '.join(f'{v:.3f}' for v in values)})")
PY

#!/usr/bin/env bash
# What a live CPU profile costs (issue 23): two servers of the same model side by side,
# one without --profiling ("off") and one with it, benched in interleaved rounds so that
# a machine whose load changes weighs on all alike:
#   off   the server without profiling;
#   idle  the server with --profiling true and no profile running (the cost of enabling it);
#   on    the same server while GET /debug/pprof/profile records (99 Hz, svg) for the whole
#         round.
#
#   scripts/profile-cost.sh BIN IMAGES_DIR OUT_DIR [ROUNDS=3] [SECONDS=10] [IMGSZ=320]
#
# Each round is `peregrine bench` closed loop at concurrency 4 for SECONDS. Writes
# OUT_DIR/{off,idle,on}-N.json, each profile's SVG, and summary.txt: per round, and the
# ratios idle/off and on/idle of throughput and latency (median of the rounds' ratios).
# Traffic goes to 127.0.0.1 only.
set -euo pipefail
bin="$1"
images="$2"
out="$3"
rounds="${4:-3}"
seconds="${5:-10}"
imgsz="${6:-320}"
port="${PORT:-18196}"
mkdir -p "$out"
# shellcheck source=scripts/bench-servers.sh
. "$(dirname "${BASH_SOURCE[0]}")/bench-servers.sh"
start_server off "$port"
start_server profiling $((port + 1)) -- --profiling true

bench() {
    "$bin" bench "$images" --url "http://127.0.0.1:$1" --concurrency 4 --duration "$seconds" \
        --output "$2" >/dev/null
}
for r in $(seq 1 "$rounds"); do
    bench "$port" "$out/off-$r.json"
    bench $((port + 1)) "$out/idle-$r.json"
    # The profile outlasts the round by a second, so every request of it is sampled.
    curl -fs -o "$out/profile-$r.svg" \
        "http://127.0.0.1:$((port + 1))/debug/pprof/profile?seconds=$((seconds + 1))&format=svg" &
    profile=$!
    bench $((port + 1)) "$out/on-$r.json"
    wait "$profile"
done
python3 - "$out" "$rounds" "$seconds" "$imgsz" <<'PY' | tee "$out/summary.txt"
import json, statistics, sys
out, rounds, seconds, imgsz = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def load(name, r):
    return json.load(open(f"{out}/{name}-{r}.json"))
print(f"{rounds} rounds of {seconds} s each, closed loop at concurrency 4, {imgsz}x{imgsz}: "
      "off = no --profiling, idle = --profiling true and no profile, on = a profile recording")
metrics = (("throughput", lambda x: x["throughput_rps"]), ("p50", lambda x: x["latency_ms"]["p50"]),
           ("p99", lambda x: x["latency_ms"]["p99"]))
ratios = {(pair, key): [] for pair in ("idle/off", "on/idle") for key, _ in metrics}
for r in range(1, rounds + 1):
    runs = {name: load(name, r) for name in ("off", "idle", "on")}
    for pair in ("idle/off", "on/idle"):
        b, a = pair.split("/")
        for key, f in metrics:
            ratios[(pair, key)].append(f(runs[b]) / f(runs[a]))
    print(f"round {r}: " + " | ".join(
        f"{n} {x['throughput_rps']:.2f} req/s P50 {x['latency_ms']['p50']:.1f} ms P99 {x['latency_ms']['p99']:.1f} ms"
        for n, x in runs.items()))
for (pair, key), values in ratios.items():
    print(f"{pair} {key}: median {statistics.median(values):.3f} (rounds: {', '.join(f'{v:.3f}' for v in values)})")
PY

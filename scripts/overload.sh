#!/usr/bin/env bash
# Overload test: measures the server's capacity, then sends 3x that rate (open loop) for
# DURATION seconds and checks that the server stays up, its memory stays flat, admitted
# requests meet their deadline at P99, and the rest are shed with 429.
#
#   scripts/overload.sh [DURATION_S=120] [OUT_DIR=target/overload]
#
# Needs a release build (made if missing). Traffic goes to 127.0.0.1 only.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
duration="${1:-120}"
out="${2:-target/overload}"
port="${PEREGRINE_OVERLOAD_PORT:-18090}"
deadline_ms=2000
images="${PEREGRINE_OVERLOAD_IMAGES:-../shared/images}"
bin=target/release/peregrine
mkdir -p "$out"
[ -x "$bin" ] || cargo build --release --locked

"$bin" serve --host 127.0.0.1 --port "$port" --max-batch 4 --queue-capacity 16 --max-in-flight 24 \
    --request-timeout-ms "$deadline_ms" --log-level warn 2>"$out/server.log" &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do
    if curl -fs "http://127.0.0.1:$port/health/ready" >/dev/null 2>&1; then break; fi
    sleep 0.5
done
curl -fs "http://127.0.0.1:$port/health/ready" >/dev/null

echo "overload: measuring capacity (closed loop, concurrency 8, 20 s)" >&2
"$bin" bench --url "http://127.0.0.1:$port" --concurrency 8 --duration 20 --output "$out/capacity.json" "$images" >&2
rate=$(python3 -c "import json;print(round(3*json.load(open('$out/capacity.json'))['throughput_rps'],2))")
echo "overload: sending $rate req/s (3x capacity) for $duration s" >&2

: >"$out/rss.log"
( while kill -0 "$server" 2>/dev/null; do
      echo "$(date +%s) $(awk '/VmRSS/{print $2}' /proc/$server/status)" >>"$out/rss.log"
      sleep 2
  done ) &
sampler=$!
"$bin" bench --url "http://127.0.0.1:$port" --rate "$rate" --duration "$duration" \
    --deadline-ms "$deadline_ms" --output "$out/overload.json" "$images" >&2
kill "$sampler" 2>/dev/null || true

alive=no
if kill -0 "$server" 2>/dev/null && curl -fs "http://127.0.0.1:$port/health/live" >/dev/null; then alive=yes; fi
python3 - "$out" "$alive" "$deadline_ms" <<'PY'
import json, sys
out, alive, deadline = sys.argv[1], sys.argv[2] == "yes", float(sys.argv[3])
r = json.load(open(f"{out}/overload.json"))
rss = [int(l.split()[1]) for l in open(f"{out}/rss.log") if len(l.split()) == 2]
n = max(1, len(rss) // 5)
early, late = sum(rss[n:2 * n]) / n, sum(rss[-n:]) / n  # skip the first fifth: warm-up
growth = (late - early) / early if early else 0.0
errors = r["errors"]
shed = errors.get("http_429", 0)
late = errors.get("http_504", 0)
other = {k: v for k, v in errors.items() if k not in ("http_429", "http_504")}
admitted = r["successes"] + late
summary = {
    "rate_rps": r["rate"], "duration_s": r["duration_s"], "requests": r["requests"],
    "admitted_ok": r["successes"], "shed_429": shed, "deadline_504": late, "other_errors": other,
    "admitted_p99_ms": r["latency_ms"]["p99"], "deadline_ms": deadline,
    "rss_kib_early": early, "rss_kib_late": late, "rss_growth": round(growth, 4),
    "server_alive": alive,
}
checks = {
    "server stayed up": alive,
    # A 504 is an admitted request answered at its deadline: fewer than 1% keeps the P99
    # of all admitted requests within the deadline.
    "admitted P99 within the deadline": r["latency_ms"]["p99"] <= deadline and late < 0.01 * admitted,
    "excess shed with 429": shed > 0,
    "no other errors": not other,
    "memory flat (within 10%)": abs(growth) <= 0.10,
}
summary["checks"] = checks
json.dump(summary, open(f"{out}/overload-summary.json", "w"), indent=2)
print(json.dumps(summary, indent=2))
failed = [k for k, ok in checks.items() if not ok]
print("overload: " + ("all checks passed" if not failed else "FAILED: " + ", ".join(failed)))
sys.exit(1 if failed else 0)
PY

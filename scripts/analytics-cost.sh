#!/usr/bin/env bash
# What a stream's analytics cost the server, in CPU seconds per detected frame: one file
# stream (the bikes clip, looped at its own rate, every frame detected at imgsz 320) with
# tracking off, with tracking and a zone and a line, and with those plus an MJPEG viewer
# (5 fps, annotated) and a latest.jpg poller. Each phase runs SECONDS s (default 20) and
# reads the server's CPU time from /proc before and after. Prints one line per phase.
#
#   scripts/analytics-cost.sh [SECONDS]      (PEREGRINE_BIN picks the binary)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
secs="${1:-20}"
bin="${PEREGRINE_BIN:-$root/target/release/peregrine}"
clip="$root/../shared/videos/bikes.mp4"
work="$(mktemp -d)"
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
tick=$(getconf CLK_TCK)

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
frames() { curl -s "$base/v1/streams/cam" | python3 -c 'import json,sys; print(json.load(sys.stdin)["counters"]["frames_detected"])'; }

run_phase() { # label tracking(true|false) viewer(0|1)
    local label=$1 tracking=$2 viewer=$3
    cat >"$work/serve.toml" <<TOML
imgsz = [320, 320]
[[streams]]
name = "cam"
url = "$clip"
loop = true
[streams.analytics]
tracking = $tracking
TOML
    if [ "$tracking" = true ]; then
        cat >>"$work/serve.toml" <<TOML
[[streams.analytics.zones]]
name = "left"
units = "normalized"
points = [[0.0, 0.0], [0.5, 0.0], [0.5, 1.0], [0.0, 1.0]]
[[streams.analytics.lines]]
name = "middle"
units = "normalized"
start = [0.5, 0.0]
end = [0.5, 1.0]
TOML
    fi
    "$bin" serve --config "$work/serve.toml" --host 127.0.0.1 --port 0 --grpc-port 0 \
        --events-db "$work/events-$label.sqlite3" --snapshots-dir "$work/snaps" \
        --stream-file-roots "$(dirname "$clip")" 2>"$work/log" &
    pid=$!
    for _ in $(seq 600); do
        base=$(sed -n 's/^peregrine: listening on \(http:\/\/[^ ]*\).*/\1/p' "$work/log" | head -1)
        [ -n "$base" ] && curl -sf "$base/health/ready" >/dev/null && break
        sleep 0.1
    done
    sleep 3 # past start-up: the first frames, the warm-up
    local viewer_pid=""
    if [ "$viewer" = 1 ]; then
        curl -s -N "$base/v1/streams/cam/mjpeg?fps=5&annotate=true" -o /dev/null &
        viewer_pid=$!
    fi
    local c0 f0 c1 f1
    c0=$(cpu_ticks "$pid"); f0=$(frames)
    sleep "$secs"
    c1=$(cpu_ticks "$pid"); f1=$(frames)
    [ -n "$viewer_pid" ] && kill "$viewer_pid" 2>/dev/null || true
    kill "$pid"; wait "$pid" 2>/dev/null || true
    python3 - "$label" "$c0" "$c1" "$f0" "$f1" "$tick" "$secs" <<'PY'
import sys
label, c0, c1, f0, f1, tick, secs = sys.argv[1], *map(float, sys.argv[2:])
cpu = (c1 - c0) / tick
frames = f1 - f0
print(f"{label:28s} frames/s {frames / secs:6.1f}   CPU s/s {cpu / secs:5.2f}   CPU ms/frame {1000 * cpu / max(frames, 1):6.2f}")
PY
}

grep -m1 'model name' /proc/cpuinfo
date -u +%Y-%m-%dT%H:%M:%SZ
run_phase tracking-off false 0
run_phase tracking-zones-lines true 0
run_phase tracking+mjpeg-viewer true 1

#!/usr/bin/env bash
# What a GB28181 stream costs the server next to an RTSP stream of the same clip. STREAMS
# streams (default 4) of the bikes clip (640x272, 25 fps, H.264) each way, detected at FPS
# frames per second each (default 5; every frame is still received and decoded):
#   - RTSP: scripts/rtsp-test-server.py (GStreamer's RTSP server), RTP over TCP;
#   - GB28181: simulated devices (the integration test's, built as the example
#     gb28181_device) registering over SIP and pushing PS over RTP/UDP when INVITEd.
# After a 10 s warm-up, the server's CPU time is read from /proc over SECONDS s (default 30).
# Prints, per phase, CPU cores per stream and frames detected per second per stream.
#
#   scripts/gb28181-cost.sh [STREAMS] [FPS] [SECONDS]     (PEREGRINE_BIN picks the server)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
streams="${1:-4}"
fps="${2:-5}"
secs="${3:-30}"
bin="${PEREGRINE_BIN:-$root/target/release/peregrine}"
clip="$root/../shared/videos/bikes.mp4"
password="cost-check-1"
cargo build --release --locked -p peregrine --example gb28181_device >&2
device="$root/target/release/examples/gb28181_device"
work="$(mktemp -d)"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
tick=$(getconf CLK_TCK)

PEREGRINE_EVENTS_DB=none PEREGRINE_STREAM_ALLOW_HOSTS=127.0.0.1 PEREGRINE_GB28181_PASSWORD="$password" \
    "$bin" serve --host 127.0.0.1 --port 0 --allow-grpc false --log-format text \
    --gb28181-listen 127.0.0.1:0 --gb28181-media-ports 32000-32099 2>"$work/server.log" &
server=$!
pids+=("$server")
for _ in $(seq 600); do
    grep -q '^peregrine: listening on ' "$work/server.log" && break
    sleep 0.1
done
base="$(sed -n 's/^peregrine: listening on //p' "$work/server.log" | head -n 1)"
sip="$(sed -n 's/^peregrine: GB28181 SIP listening on //p' "$work/server.log" | head -n 1)"
until curl -sf "$base/health/ready" >/dev/null; do sleep 0.2; done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
detected() { # sum of frames_detected over the streams named $1-*
    curl -s "$base/v1/streams" | python3 -c '
import json, sys, urllib.request
prefix, base = sys.argv[1], sys.argv[2]
names = [s["name"] for s in json.load(sys.stdin)["streams"] if s["name"].startswith(prefix)]
print(sum(json.load(urllib.request.urlopen(f"{base}/v1/streams/{n}"))["counters"]["frames_detected"] for n in names))
' "$1" "$base"
}
add() { # name url
    curl -sf -X POST "$base/v1/streams" -H 'content-type: application/json' \
        -d "{\"name\": \"$1\", \"url\": \"$2\", \"fps\": $fps, \"decode_threads\": 1, \"transport\": \"tcp\"}" >/dev/null
}
remove_all() { # prefix
    for i in $(seq "$streams"); do curl -sf -X DELETE "$base/v1/streams/$1-$i" >/dev/null; done
}
measure() { # label prefix
    sleep 10
    local t0 f0 t1 f1
    t0=$(cpu_ticks "$server"); f0=$(detected "$2")
    sleep "$secs"
    t1=$(cpu_ticks "$server"); f1=$(detected "$2")
    python3 -c "
t, n, s, f = ($t1 - $t0) / $tick, $streams, $secs, ($f1 - $f0)
print(f'$1: {n} streams, {t / s / n:.3f} cores per stream, {f / s / n:.2f} frames detected/s per stream')"
}

: >"$work/rtsp.out"
/usr/bin/python3 "$root/scripts/rtsp-test-server.py" cam="$clip" >"$work/rtsp.out" 2>"$work/rtsp.log" &
pids+=("$!")
until grep -q READY "$work/rtsp.out"; do sleep 0.1; done
rtsp_port="$(awk '/READY/ {print $2}' "$work/rtsp.out")"
for i in $(seq "$streams"); do add "rtsp-$i" "rtsp://127.0.0.1:$rtsp_port/cam"; done
measure "rtsp (rtp/tcp)" rtsp
remove_all rtsp

# Enough rounds of the clip (about 10 s each) for the warm-up and the measurement.
: >"$work/device.out"
"$device" "$sip" "$password" "$clip" "$streams" $(((secs + 40) / 8)) >"$work/device.out" 2>"$work/device.log" &
pids+=("$!")
until grep -q REGISTERED "$work/device.out"; do sleep 0.1; done
for i in $(seq "$streams"); do
    n=$(printf %02d "$i")
    add "gb-$i" "gb28181://340200000013200000$n/340200000013100000$n"
done
measure "gb28181 (ps over rtp/udp)" gb
remove_all gb
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"

#!/usr/bin/env bash
# Load/unload memory check: serves one repository model, then unloads and reloads it
# CYCLES times (one detection after each load) and reports the server's resident memory
# after the first load and every 10 cycles, with the growth over the run.
#
#   scripts/reload-memory.sh [CYCLES=100] [IMGSZ=320]
#
# Needs a release build (made if missing). Traffic goes to 127.0.0.1 only.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cycles="${1:-100}"
imgsz="${2:-320}"
port="${PEREGRINE_RELOAD_PORT:-18095}"
bin=target/release/peregrine
[ -x "$bin" ] || cargo build --release --locked
repo="$(mktemp -d)"
mkdir -p "$repo/det/1"
ln "models/yolo11n.onnx" "$repo/det/1/model.onnx" 2>/dev/null || cp "models/yolo11n.onnx" "$repo/det/1/model.onnx"
printf 'imgsz = [%s, %s]\nmax_batch = 1\nthreads = 1\n' "$imgsz" "$imgsz" >"$repo/det/config.toml"
"$bin" serve --host 127.0.0.1 --port "$port" --allow-grpc false --model-repository "$repo" \
    --log-level warn 2>"$repo/server.log" &
server=$!
trap 'kill "$server" 2>/dev/null || true; rm -rf "$repo"' EXIT
for _ in $(seq 1 240); do
    curl -fs "http://127.0.0.1:$port/health/ready" >/dev/null 2>&1 && break
    sleep 0.5
done
image=../shared/images/bus.jpg
detect() { curl -fs -o /dev/null -H "content-type: image/jpeg" --data-binary @"$image" "http://127.0.0.1:$port/v1/detect"; }
rss() { awk '/VmRSS/{print $2}' "/proc/$server/status"; }
detect
start=$(rss)
echo "reload-memory: after the first load: $start KiB"
for i in $(seq 1 "$cycles"); do
    curl -fs -X POST "http://127.0.0.1:$port/v2/repository/models/det/unload" >/dev/null
    curl -fs -X POST "http://127.0.0.1:$port/v2/repository/models/det/load" >/dev/null
    detect
    if [ $((i % 10)) -eq 0 ]; then echo "reload-memory: after $i cycles: $(rss) KiB"; fi
done
end=$(rss)
python3 -c "print(f'reload-memory: {$start} -> {$end} KiB over $cycles cycles: {($end-$start)/$start*100:+.1f}%')"

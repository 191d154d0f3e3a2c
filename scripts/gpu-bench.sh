#!/usr/bin/env bash
# GPU figures, on the GPU machine, with ONNX Runtime's GPU build active
# (`source /opt/ort/activate.sh`, see ../shared/gpu/README.md):
#
#   scripts/gpu-bench.sh [BIN] [MODELS_DIR] [IMAGES_DIR] [OUT_DIR]
#
# 1. the model alone on the CUDA provider, by batch size, for each of yolo11n (fp32) and
#    yolo11n-fp16 found in MODELS_DIR;
# 2. the server end to end over HTTP with real JPEGs (decoding on the machine's cores) at
#    several concurrencies.
# Traffic goes to 127.0.0.1 only.
set -euo pipefail
bin="${1:-target/release/peregrine}"
models="${2:-models}"
images="${3:-../shared/images}"
out="${4:-target/gpu-bench}"
port=18100
mkdir -p "$out"
ready() {
    curl -fs "http://127.0.0.1:$port/health/ready" >/dev/null 2>&1 ||
        python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health/ready', timeout=2)" 2>/dev/null
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/gpu.txt" 2>&1 || true
nproc >"$out/cpus.txt"
cat "$out/gpu.txt" >&2

for m in yolo11n yolo11n-fp16; do
    [ -f "$models/$m.onnx" ] || continue
    echo "== model alone: $m" >&2
    "$bin" bench-model --provider cuda --model "$models/$m.onnx" --batch 1,8,32,64 --seconds 5 \
        --output "$out/model-$m.json" "$images"
done

cores=$(nproc)
"$bin" serve --provider cuda --host 127.0.0.1 --port "$port" --max-batch 32 --max-queue-delay-us 2000 \
    --instances 2 --queue-capacity 1024 --max-in-flight 2048 --preprocess-threads "$cores" \
    --log-level warn 2>"$out/server.log" &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
    ready && break
    sleep 0.5
done
for c in 16 64 256; do
    echo "== HTTP end to end, concurrency $c" >&2
    "$bin" bench --url "http://127.0.0.1:$port" --concurrency "$c" --duration 15 \
        --output "$out/http-c$c.json" "$images"
done
kill -TERM "$server"
wait "$server" || true

#!/usr/bin/env bash
# Instance placement over GPUs, on a GPU machine with ONNX Runtime's GPU build active
# (`source /opt/ort/activate.sh`, see ../shared/gpu/README.md):
#
#   scripts/gpus-check.sh BIN MODEL IMAGE_DIR [SERVE FLAGS...]
#
# Starts `BIN serve --provider cuda MODEL` with the given flags (say `--gpus 0,1
# --instances 2`), loads it for 8 s with `BIN bench` at concurrency 64 over IMAGE_DIR's
# photos, then prints the bench's figures, each instance's device and state from
# /health/ready, and the per-device series of /metrics (batches, images, instances, GPU
# utilisation and memory), so that a run shows where the work went. Traffic stays on
# 127.0.0.1.
set -uo pipefail
bin="$1"
model="$2"
images="$3"
shift 3
port=18300
"$bin" serve --provider cuda --threads 1 --prefer-nhwc --model "$model" --host 127.0.0.1 --port "$port" \
    --grpc-port 18301 --queue-capacity 4096 --max-in-flight 8192 --log-level warn "$@" &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 1 240); do
    curl -fs "http://127.0.0.1:$port/health/ready" >/dev/null 2>&1 && break
    kill -0 "$server" 2>/dev/null || { echo "the server exited before it was ready" >&2; exit 1; }
    sleep 0.5
done
echo "== serve flags: $*"
"$bin" bench --url "http://127.0.0.1:$port" --concurrency 64 --duration 8 --output /tmp/gpus-check.json \
    "$images"/*.jpg >/dev/null 2>&1 || echo "bench failed (rc $?)"
python3 -c "import json;r=json.load(open('/tmp/gpus-check.json'));print('requests', r['requests'], 'answered', r['successes'], 'req/s', round(r['throughput_rps'], 1), 'p50/p99 ms', r['latency_ms']['p50'], r['latency_ms']['p99'], 'errors', r['errors'])" ||
    cat /tmp/gpus-check.json
echo "== /health/ready"
curl -s "http://127.0.0.1:$port/health/ready"
echo
echo "== /metrics, per device"
curl -s "http://127.0.0.1:$port/metrics" |
    grep -E '^peregrine_(device_batches_total|inferred_images_total|instances|device_failures_total|gpu_utilization_ratio|gpu_memory_used_bytes)\{'

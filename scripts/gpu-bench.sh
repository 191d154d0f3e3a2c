#!/usr/bin/env bash
# GPU figures, on the GPU machine, with ONNX Runtime's GPU build active
# (`source /opt/ort/activate.sh`, see ../shared/gpu/README.md). The machine has no network
# and a 64 MiB transfer limit: carry a stripped, xz-compressed release binary, the images,
# yolo11n-fp16.onnx and perf_analyzer (.cache/perf-analyzer/bin/perf_analyzer, which runs
# there as is) beside the two halves of ONNX Runtime, then:
#
#   scripts/gpu-bench.sh BIN DATA_DIR OUT_DIR [PERF_ANALYZER]
#
# STEPS (environment, default "model parity serve decode e2e jpeg-parity") picks the parts to run;
# MODEL_BATCHES the model step's batch sizes; E2E_VARIANTS (";"-separated "label max-batch
# padded-sizes instances delay-us [serve flags]") the e2e step's server configurations.
# DATA_DIR holds images/ (the shared test photos), videos/ (the shared clips, for the JPEG
# corpus) and models/ (yolo11n.onnx, yolo11n-fp16.onnx). The jpeg-parity step generates its
# corpus (scripts/make-jpeg-corpus.py, OpenCV's Python package) unless CORPUS names one, and
# also runs BEFORE_BIN's GPU decoding when that names an older binary. Writes into OUT_DIR:
#   results.txt     every figure, step by step (model alone by batch size for fp32 and fp16,
#                   plain and rewritten graphs; HTTP end to end by concurrency; the open loop
#                   at 70% of peak; perf_analyzer over HTTP and gRPC)
#   parity-*.jsonl  detections on the GPU (for comparison with the CPU path where it runs)
#   det-*.jsonl     each e2e variant's detections over HTTP (compared in results.txt)
#   jdet-*.jsonl    the jpeg-parity step's detections over the corpus, likewise
#   log.txt         everything the steps printed
# Each step has its own time limit, so one that hangs costs only itself. Traffic goes to
# 127.0.0.1 only.
set -uo pipefail
bin="$1"
data="$2"
out="$3"
pa="${4:-}"
mkdir -p "$out"
res="$out/results.txt"
log="$out/log.txt"
port=18100
grpc_port=18101
cores=$(nproc)
note() { echo "== $*" | tee -a "$res" >&2; }
step() {
    local limit=$1
    shift
    timeout "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    [ $rc -eq 0 ] || note "step failed (rc $rc): $*"
    return $rc
}
json() { [ -f "$1" ] && { cat "$1" >>"$res"; echo >>"$res"; }; }

note "machine: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader), $cores cores, $(date -u +%FT%TZ)"
jpegs=$(ls "$data"/images/*.jpg)
steps="${STEPS:-model parity serve decode e2e jpeg-parity}"
wants() { case " $steps " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# 1. The model alone by batch size, fp32 and fp16, plain and rewritten graphs, each batch
# size its own session with its input shape fixed (as the server runs them), NHWC kernels;
# the rewritten graph also with its input and output bound in device memory (--device-io).
# Throughput counts the measured runs only (warm-up excluded).
batches="${MODEL_BATCHES:-1,8,32,64}"
wants model && for m in yolo11n yolo11n-fp16; do
    for v in "off" "on" "on --device-io"; do
        set -- $v
        note "model alone: $m, rewrite $*, fixed shapes, NHWC"
        step 150 "$bin" bench-model --provider cuda --threads 1 --prefer-nhwc --fixed-shapes \
            --model "$data/models/$m.onnx" --graph-rewrite "$@" --batch "$batches" --seconds 2 \
            --output "$out/m.json" $jpegs
        json "$out/m.json"
    done
done

# 2. Detections on the GPU, for parity with the CPU path.
wants parity && for v in "yolo11n on" "yolo11n off" "yolo11n-fp16 on"; do
    set -- $v
    timeout 60 "$bin" detect --provider cuda --threads 1 --model "$data/models/$1.onnx" --graph-rewrite "$2" \
        --batch 8 "$data"/images/* >"$out/parity-$1-$2.jsonl" 2>>"$log" || note "detect $1 $2 failed"
done

# 3. The server end to end: real JPEGs decoded on the machine's cores. One ONNX Runtime
# session per padded batch size, so that no session's input shape changes between runs
# (CUDA re-prepares its convolutions on every change: seconds per batch when sizes vary).
serve_bin="$bin"
serve() {
    local model=$1 max=$2 sizes=$3 instances=${4:-2} delay=${5:-2000}
    shift 3
    shift 2 2>/dev/null || shift $#
    # Any further arguments are extra serve flags.
    "$serve_bin" serve --provider cuda --threads 1 --prefer-nhwc --model "$data/models/$model.onnx" --host 127.0.0.1 \
        --port "$port" --grpc-port "$grpc_port" --instances "$instances" --max-batch "$max" \
        --padded-batch-sizes "$sizes" --session-per-batch-size true --max-queue-delay-us "$delay" \
        --queue-capacity 4096 --max-in-flight 8192 --preprocess-threads "$cores" --log-level warn "$@" 2>>"$log" &
    server=$!
    for _ in $(seq 1 240); do
        curl -fs "http://127.0.0.1:$port/health/ready" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    note "server for $model not ready"
    return 1
}
stop() { kill -TERM "$server" 2>/dev/null; wait "$server" 2>/dev/null; }
peak_of() { python3 -c "import json,sys;print(max(json.load(open(f))['throughput_rps'] for f in sys.argv[1:]))" "$@"; }
sweep() {
    local label=$1
    shift
    runs=()
    for c in "$@"; do
        note "HTTP end to end: $label, concurrency $c"
        step 40 "$bin" bench --url "http://127.0.0.1:$port" --concurrency "$c" --duration 8 \
            --output "$out/h$c.json" $jpegs && runs+=("$out/h$c.json")
        json "$out/h$c.json"
    done
    if [ ${#runs[@]} -gt 0 ]; then
        peak=$(peak_of "${runs[@]}")
        rate=$(python3 -c "print(round(0.7*$peak, 1))")
        note "open loop at 70% of the peak $peak req/s: $rate req/s for 15 s ($label)"
        step 40 "$bin" bench --url "http://127.0.0.1:$port" --rate "$rate" --duration 15 \
            --output "$out/open.json" $jpegs
        json "$out/open.json"
    fi
}

if wants serve && serve yolo11n 64 1,4,16,64; then
    sweep "yolo11n rewritten, batches up to 64" 16 32 64 128 256 512
    if [ -n "$pa" ]; then
        for proto in http grpc; do
            url="127.0.0.1:$port"
            [ $proto = grpc ] && url="127.0.0.1:$grpc_port"
            note "perf_analyzer, default settings, $proto, yolo11n_tensor"
            timeout 90 "$pa" -m yolo11n_tensor -u "$url" -i $proto >>"$res" 2>&1 || note "perf_analyzer rc $?"
        done
        python3 - "$data/images/bus.jpg" "$out/pa-input.json" <<'PY'
import base64, json, struct, sys
jpeg = open(sys.argv[1], "rb").read()
tensor = struct.pack("<I", len(jpeg)) + jpeg
json.dump({"data": [{"IMAGE": {"b64": base64.b64encode(tensor).decode()}}]}, open(sys.argv[2], "w"))
PY
        for proto in http grpc; do
            url="127.0.0.1:$port"
            [ $proto = grpc ] && url="127.0.0.1:$grpc_port"
            note "perf_analyzer, $proto, detection model with a JPEG (bus.jpg), concurrency 64"
            timeout 90 "$pa" -m yolo11n -u "$url" -i $proto --input-data "$out/pa-input.json" \
                --shape IMAGE:1 --concurrency-range 64 >>"$res" 2>&1 || note "perf_analyzer rc $?"
        done
        note "peregrine bench, the same request (bus.jpg), concurrency 64"
        step 30 "$bin" bench --url "http://127.0.0.1:$port" --concurrency 64 --duration 8 \
            --output "$out/b.json" "$data/images/bus.jpg"
        json "$out/b.json"
        rm -f "$out/pa-input.json"
    fi
    stop
fi
if wants serve && serve yolo11n 32 1,4,16,32; then
    sweep "yolo11n rewritten, batches up to 32" 64 128 256
    stop
fi
# 4. Image preparation alone (decode and letterbox into 640x640): on the CPU cores as the
# server does it, and on the GPU (nvJPEG's hardware decoder and NPP), with the GPU's
# canvases compared with the CPU's.
wants decode && for cfg in "false false" "true false" "true true"; do
    set -- $cfg
    note "decode alone on the CPU: reused buffers $1, JPEG DCT scaling $2"
    step 60 "$bin" bench-decode --threads 1,8,$cores --seconds 3 --reuse-buffers "$1" --jpeg-dct-scaling "$2" \
        --output "$out/d.json" $jpegs
    json "$out/d.json"
done
wants decode && for b in 8 32; do
    note "decode alone on the GPU: $b images per call"
    timeout 90 "$bin" bench-decode --gpu-batch "$b" --threads 1,2 --seconds 3 --output "$out/d.json" $jpegs \
        >>"$res" 2>>"$log" || note "GPU decode rc $?"
    json "$out/d.json"
done

# 5. End to end with the JPEGs decoded on the CPU cores or on the GPU, same server
# otherwise; detections of each compared with the first's (CPU decoding).
# Each variant: label, max batch, padded sizes, instances, batching delay (us), extra flags.
if wants e2e; then
    default_variants="cpu 32 1,4,16,32 2 2000;gpu 32 1,4,16,32 2 2000 --gpu-jpeg-decode;gpu-b16x4 16 1,4,8,16 4 2000 --gpu-jpeg-decode;gpu-b8x8 8 1,4,8 8 2000 --gpu-jpeg-decode"
    IFS=';' read -r -a variants <<<"${E2E_VARIANTS:-$default_variants}"
    for v in "${variants[@]}"; do
        set -- $v
        label=$1
        shift
        if serve yolo11n "$@"; then
            python3 "$(dirname "$0")/server-detections.py" "http://127.0.0.1:$port" "$data"/images/* \
                >"$out/det-$label.jsonl" 2>>"$log" || note "detections for $label failed"
            sweep "yolo11n rewritten, $label (max batch $1, sizes $2, instances $3, delay $4 us, ${*:5})" 64 256
            stop
        fi
    done
    note "detections on the 14 shared images against the first variant (class, IoU >= 0.9, score within 0.02)"
    first=${variants[0]%% *}
    python3 "$(dirname "$0")/compare-detections.py" "$out/det-$first.jsonl" \
        $(ls "$out"/det-*.jsonl | grep -v "/det-$first.jsonl") >>"$res" 2>&1
fi

# 6. JPEG decoding parity over a corpus of a few hundred files (subsamplings, qualities,
# crops, small images, restart markers, gray, progressive and 4:1:1 files that must stay on
# the CPU, video frames): the GPU's canvases against the CPU's, stage by stage, then the
# server's detections with GPU decoding against CPU decoding, same server otherwise
# (sequential requests, batches of one).
if wants jpeg-parity; then
    corpus="${CORPUS:-$out/corpus}"
    if [ -z "${CORPUS:-}" ]; then
        python3 "$(dirname "$0")/make-jpeg-corpus.py" "$data/images" "$data/videos" "$corpus" >>"$res" 2>&1 ||
            note "corpus generation failed"
    fi
    note "JPEG parity: GPU canvases vs CPU canvases over $(ls "$corpus" | wc -l) files (bench-decode --parity-only)"
    timeout 300 "$bin" bench-decode --gpu-batch 8 --parity-only true "$corpus"/*.jpg >>"$res" 2>>"$log" ||
        note "canvas parity rc $?"
    jvariants=("cpu $bin" "gpu $bin --gpu-jpeg-decode")
    [ -n "${BEFORE_BIN:-}" ] && jvariants+=("gpu-before $BEFORE_BIN --gpu-jpeg-decode")
    for v in "${jvariants[@]}"; do
        set -- $v
        label=$1 serve_bin=$2
        shift 2
        if serve yolo11n 1 1 1 0 "$@"; then
            timeout 300 python3 "$(dirname "$0")/server-detections.py" "http://127.0.0.1:$port" "$corpus"/*.jpg \
                >"$out/jdet-$label.jsonl" 2>>"$log" || note "corpus detections for $label failed"
            stop
        fi
    done
    serve_bin="$bin"
    note "JPEG parity: detections over the corpus against CPU decoding (class, IoU >= 0.9, score within 0.02)"
    python3 "$(dirname "$0")/compare-detections.py" "$out/jdet-cpu.jsonl" $(ls "$out"/jdet-gpu*.jsonl) >>"$res" 2>&1
    [ -z "${CORPUS:-}" ] && rm -rf "$corpus"
fi

rm -f "$out"/m.json "$out"/d.json "$out"/h*.json "$out"/open.json "$out"/b.json
note "done $(date -u +%FT%TZ)"

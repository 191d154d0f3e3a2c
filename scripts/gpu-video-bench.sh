#!/usr/bin/env bash
# NVDEC figures on the GPU machine: decoder parity and decoding capacity without ONNX
# Runtime (the `decoder_parity` and `capacity` examples), then streams with detection
# through the real server, CPU decoding against NVDEC (needs ONNX Runtime's GPU build
# active: `source /opt/ort/activate.sh`, see ../shared/gpu/README.md).
#
#   scripts/gpu-video-bench.sh BIN_DIR CLIPS_DIR OUT_DIR
#
# BIN_DIR holds release builds of `peregrine` and the video crate's examples
# `decoder_parity` and `capacity` (and the binary crate's `gpu_frames_parity` for the
# `frames` step); CLIPS_DIR the clips of scripts/make-video-corpus.sh (and any others to
# compare). STEPS (default "parity decode serve churn") picks the parts, among them also
# `frames` (canvases made on the GPU from NVDEC's surfaces against the CPU path's, every
# picture of every clip, and decoding capacity with the pictures left on the GPU, without
# ONNX Runtime; DECODE_STREAMS_GPU_FRAMES, default 100,150,200) and `gpuframes` (the 1080p sweep with
# detection, NVDEC decoding, without and with --gpu-frames; GPU_FRAMES_STREAMS, default
# 50,100,125) and `wide` (the 720p25 clip at every frame with --gpu-frames, the square 640x640
# canvas against the 384x640 one that fits 16:9 pictures, WIDE_STREAMS, default 150,200,250,
# and the 1080p clip on the 384x640 canvas, WIDE_STREAMS_1080, default 150,200, empty: none; then the model
# alone at both sizes, batches of 16 on 8 instances; WIDE_MODEL names another model file for
# all of it, e.g. yolo11n-fp16.onnx, which reached 5,020 frames/s where fp32 stopped at 4,590);
# DECODE_STREAMS_CPU / DECODE_STREAMS_NVDEC and SERVE_STREAMS_CPU / SERVE_STREAMS_NVDEC the
# stream counts of the capacity sweeps (1080p25 clip, every frame), DECODE_STREAMS_720 and
# SERVE_STREAMS_720 those of the NVDEC sweeps of the 720p25 clip; churn adds and removes
# 100 NVDEC streams twice (scripts/stream-churn.py; CHURN_FLAGS adds serve flags, e.g.
# --gpu-frames). Writes OUT_DIR/results.md.
#
# The 1080p clip is bbb-1080p25-camera.mp4 (no B-frames, as cameras send) where the clips
# have it: a clip with B-frames adds its reorder delay (up to ~150 ms at 25 fps) to every
# latency figure whatever decodes it. Sweeps start all their streams at once and measure
# after WARMUP seconds (default 10), so the start-up of a hundred decoders is left out.
set -uo pipefail
bin="$1"
clips="$2"
out="$3"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$out"
results="$out/results.md"
steps="${STEPS:-parity decode serve churn}"
clip1080="$clips/bbb-1080p25-camera.mp4"
[ -f "$clip1080" ] || clip1080="$clips/bbb-1080p25.mp4"
clip720="$clips/bbb-720p-baseline.mp4"
warmup="${WARMUP:-10}"
say() { echo "$*" | tee -a "$results"; }
# Lines FFmpeg logs per decoder (e.g. a 4:4:4 stream NVDEC refuses) are kept out of the table.
quiet() { grep -v -E '^\[(h264|hevc|AVHWDeviceContext)' ; }

say "# NVDEC figures, $(date -u '+%Y-%m-%d %H:%M UTC')"
say "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1); $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"

if [[ " $steps " == *" parity "* ]]; then
    say ""
    say "## Decoder parity and speed (decoder_parity --parallel 8)"
    timeout 300 "$bin/decoder_parity" --parallel 8 "$clips"/*.mp4 2>"$out/parity.log" | quiet | tee -a "$results"
fi

if [[ " $steps " == *" decode "* ]]; then
    for decoder in cpu nvdec; do
        var="DECODE_STREAMS_${decoder^^}"
        counts="${!var:-$([ $decoder = cpu ] && echo 8,16,24 || echo 50,100,150)}"
        say ""
        say "## Decoding only, $decoder, $(basename "$clip1080") every frame converted (capacity --detector fake)"
        timeout 400 "$bin/capacity" --detector fake --decoder "$decoder" --fps 0 --clip "$clip1080" \
            --streams "$counts" --seconds 10 --warmup "$warmup" 2>"$out/capacity-$decoder.log" | grep -E '^\||decoder' | tee -a "$results"
    done
    if [ -f "$clip720" ]; then
        say ""
        say "## Decoding only, nvdec, $(basename "$clip720") every frame converted (capacity --detector fake)"
        timeout 400 "$bin/capacity" --detector fake --decoder nvdec --fps 0 --clip "$clip720" \
            --streams "${DECODE_STREAMS_720:-200,250}" --seconds 10 --warmup "$warmup" 2>"$out/capacity-720.log" \
            | grep -E '^\||decoder' | tee -a "$results"
    fi
fi

if [[ " $steps " == *" serve "* ]]; then
    # Fine padded sizes: with 1,4,16,32 most batches were padded a long way and the total
    # was 10% lower (docs/benchmarks.md, "Where the 2,000 frames/s cap sits").
    flags=(--provider cuda --threads 1 --prefer-nhwc --instances 8 --max-batch 16
        --padded-batch-sizes 1,2,4,8,12,16 --session-per-batch-size true --max-queue-delay-us 4000)
    for decoder in cpu auto; do
        var="SERVE_STREAMS_$([ $decoder = cpu ] && echo CPU || echo NVDEC)"
        counts="${!var:-$([ $decoder = cpu ] && echo 20,30,40 || echo 50,75,100)}"
        say ""
        say "## Streams with detection, decoder $decoder, $(basename "$clip1080") every frame (bench-video.py; ${flags[*]})"
        timeout 540 python3 "$root/scripts/bench-video.py" --bin "$bin/peregrine" --clip "$clip1080" --fps 0 \
            --streams "$counts" --seconds 10 --settle "$warmup" --decoder "$decoder" -- "${flags[@]}" \
            2>"$out/serve-$decoder.log" | tee -a "$results"
    done
    if [ -f "$clip720" ] && [ -n "${SERVE_STREAMS_720:-200}" ]; then
        say ""
        say "## Streams with detection, decoder auto, $(basename "$clip720") every frame (bench-video.py; ${flags[*]})"
        timeout 540 python3 "$root/scripts/bench-video.py" --bin "$bin/peregrine" --clip "$clip720" --fps 0 \
            --streams "${SERVE_STREAMS_720:-200}" --seconds 10 --settle "$warmup" --decoder auto -- "${flags[@]}" \
            2>"$out/serve-720.log" | tee -a "$results"
    fi
fi

if [[ " $steps " == *" frames "* ]]; then
    say ""
    say "## Frames letterboxed on the GPU against the CPU path (gpu_frames_parity, every picture)"
    timeout 400 "$bin/gpu_frames_parity" "$clips"/*.mp4 2>"$out/frames.log" | quiet | tee -a "$results"
    say ""
    say "## Decoding only, nvdec, pictures left on the GPU, $(basename "$clip1080") every frame (capacity --detector fake --gpu-frames)"
    timeout 400 "$bin/capacity" --detector fake --decoder nvdec --gpu-frames --fps 0 --clip "$clip1080" \
        --streams "${DECODE_STREAMS_GPU_FRAMES:-100,150,200}" --seconds 10 --warmup "$warmup" \
        2>"$out/capacity-gpu-frames.log" | grep -E '^\||decoder' | tee -a "$results"
fi

if [[ " $steps " == *" gpuframes "* ]]; then
    flags=(--provider cuda --threads 1 --prefer-nhwc --instances 8 --max-batch 16
        --padded-batch-sizes 1,2,4,8,12,16 --session-per-batch-size true --max-queue-delay-us 4000)
    for extra in "" "--gpu-frames"; do
        say ""
        say "## Streams with detection, NVDEC, $(basename "$clip1080") every frame, ${extra:-frames to the host} (bench-video.py; ${flags[*]})"
        # shellcheck disable=SC2086 # an empty $extra adds no word
        timeout 540 python3 "$root/scripts/bench-video.py" --bin "$bin/peregrine" --clip "$clip1080" --fps 0 \
            --streams "${GPU_FRAMES_STREAMS:-50,100,125}" --seconds 10 --settle "$warmup" --decoder auto \
            -- "${flags[@]}" $extra 2>"$out/gpuframes${extra:+-on}.log" | tee -a "$results"
    done
fi

if [[ " $steps " == *" wide "* ]]; then
    flags=(--provider cuda --threads 1 --prefer-nhwc --instances 8 --max-batch 16
        --padded-batch-sizes 1,2,4,8,12,16 --session-per-batch-size true --max-queue-delay-us 4000 --gpu-frames)
    model=()
    [ -n "${WIDE_MODEL:-}" ] && model=(--model "$WIDE_MODEL") && say "" && say "Model: $WIDE_MODEL"
    flags+=("${model[@]}")
    for imgsz in 384,640 640; do
        counts="${WIDE_STREAMS:-150,200,250}"
        [ "$imgsz" = 640 ] && counts="${counts%,*}"
        say ""
        say "## Streams with detection, NVDEC, frames on the GPU, $(basename "$clip720") every frame, --imgsz $imgsz (bench-video.py; ${flags[*]})"
        timeout 200 python3 "$root/scripts/bench-video.py" --bin "$bin/peregrine" --clip "$clip720" --fps 0 \
            --streams "$counts" --seconds 10 --settle "$warmup" --decoder auto \
            -- "${flags[@]}" --imgsz "$imgsz" 2>"$out/wide-${imgsz/,/x}.log" | tee -a "$results"
    done
    if [ -n "${WIDE_STREAMS_1080-150,200}" ]; then
        say ""
        say "## Streams with detection, NVDEC, frames on the GPU, $(basename "$clip1080") every frame, --imgsz 384,640"
        timeout 150 python3 "$root/scripts/bench-video.py" --bin "$bin/peregrine" --clip "$clip1080" --fps 0 \
            --streams "${WIDE_STREAMS_1080-150,200}" --seconds 10 --settle "$warmup" --decoder auto \
            -- "${flags[@]}" --imgsz 384,640 2>"$out/wide-1080.log" | tee -a "$results"
    fi
    say ""
    say "## The model alone, 8 instances, batches of 16 (bench-model --fixed-shapes --device-io)"
    for imgsz in 640 384,640; do
        say "--imgsz $imgsz: $(timeout 60 "$bin/peregrine" bench-model "${model[@]}" --provider cuda --threads 1 --prefer-nhwc \
            --fixed-shapes --graph-rewrite on --device-io --instances 8 --batch 16 --seconds 4 --imgsz "$imgsz" \
            2>"$out/model-${imgsz/,/x}.log" | grep -E '^batch' | tail -1)"
    done
fi

if [[ " $steps " == *" churn "* ]]; then
    say ""
    say "## 100 NVDEC streams added and removed, twice (stream-churn.py)"
    # shellcheck disable=SC2086 # CHURN_FLAGS are words to split
    timeout 300 python3 "$root/scripts/stream-churn.py" --bin "$bin/peregrine" --clip "$clip1080" \
        --count 100 --rounds 2 --decoder nvdec -- --provider cuda --threads 1 --instances 1 --max-batch 32 \
        --padded-batch-sizes 1,4,16,32 --session-per-batch-size true ${CHURN_FLAGS:-} 2>"$out/churn.log" | tee -a "$results"
fi

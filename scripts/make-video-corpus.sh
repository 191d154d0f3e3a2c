#!/usr/bin/env bash
# Clips for comparing decoders (NVDEC against FFmpeg's software decoders) and for video
# capacity runs, made from the shared clips with GStreamer's encoders (x264, x265; installed
# by scripts/setup-video-peers.sh):
#
#   scripts/make-video-corpus.sh OUT_DIR
#
#   bbb-1080p25.mp4       1920x1080 at 25 fps, H.264 High with B-frames (5 s; the capacity clip)
#   bbb-1080p25-camera.mp4 the same without B-frames, as most IP cameras send: B-frames make
#                         the decoder hold a picture until the ones shown before it arrive
#   bbb-720p-baseline.mp4 1280x720, H.264 Constrained Baseline (no B-frames)
#   bikes-odd.mp4         1278x718, H.264 High: a size that is not a multiple of 16 (cropped)
#   bikes-small.mp4       322x242, H.264 High
#   bbb-720p-h265.mp4     1280x720, H.265 Main
#   bikes-h265-10bit.mp4  640x272, H.265 Main 10 (skipped where x265 lacks 10-bit)
#   bikes-444.mp4         640x272, H.264 High 4:4:4 (NVDEC does not take it: the fallback)
#
# A clip already there is kept.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:?usage: make-video-corpus.sh OUT_DIR}"
videos="$root/../shared/videos"
mkdir -p "$out"

# make NAME SOURCE "RAW CAPS" "ENCODER ! PARSER"
make() {
    local name="$1" source="$2" caps="$3" encode="$4"
    [ -f "$out/$name" ] && return 0
    echo "make-video-corpus: $name" >&2
    # shellcheck disable=SC2086 # the pipeline's words are meant to split
    if ! gst-launch-1.0 -q filesrc location="$videos/$source" ! qtdemux ! h264parse ! avdec_h264 \
        ! videoconvert ! videoscale ! videorate ! $caps ! $encode ! mp4mux \
        ! filesink location="$out/$name.part" >/dev/null 2>"$out/$name.log"; then
        echo "make-video-corpus: $name could not be made (see $out/$name.log)" >&2
        rm -f "$out/$name.part"
        return 0
    fi
    mv "$out/$name.part" "$out/$name"
    rm -f "$out/$name.log"
}

x264="x264enc speed-preset=veryfast key-int-max=50"
make bbb-1080p25.mp4 bigbuckbunny.mp4 "video/x-raw,width=1920,height=1080,framerate=25/1,format=I420" \
    "$x264 bframes=2 bitrate=6000 ! video/x-h264,profile=high ! h264parse"
make bbb-1080p25-camera.mp4 bigbuckbunny.mp4 "video/x-raw,width=1920,height=1080,framerate=25/1,format=I420" \
    "$x264 bframes=0 bitrate=6000 ! video/x-h264,profile=high ! h264parse"
make bbb-720p-baseline.mp4 bigbuckbunny.mp4 "video/x-raw,width=1280,height=720,format=I420" \
    "$x264 bitrate=2500 ! video/x-h264,profile=constrained-baseline ! h264parse"
make bikes-odd.mp4 bikes.mp4 "video/x-raw,width=1278,height=718,pixel-aspect-ratio=1/1,format=I420" \
    "$x264 bframes=2 bitrate=2500 ! video/x-h264,profile=high ! h264parse"
make bikes-small.mp4 bikes.mp4 "video/x-raw,width=322,height=242,pixel-aspect-ratio=1/1,format=I420" \
    "$x264 bframes=2 bitrate=400 ! video/x-h264,profile=high ! h264parse"
make bbb-720p-h265.mp4 bigbuckbunny.mp4 "video/x-raw,width=1280,height=720,format=I420" \
    "x265enc speed-preset=ultrafast key-int-max=50 bitrate=2000 ! h265parse"
make bikes-h265-10bit.mp4 bikes.mp4 "video/x-raw,format=I420_10LE" \
    "x265enc speed-preset=ultrafast key-int-max=50 bitrate=800 ! h265parse"
make bikes-444.mp4 bikes.mp4 "video/x-raw,format=Y444" \
    "$x264 bitrate=1500 ! video/x-h264,profile=high-4:4:4 ! h264parse"
ls -l "$out"

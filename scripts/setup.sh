#!/usr/bin/env bash
# Everything a fresh Debian/Ubuntu machine with Rust needs before `cargo build`:
# - system packages: cmake and nasm (libjpeg-turbo and FFmpeg are built from source and
#   linked statically), make, xz, pkg-config and libclang (FFmpeg's build and its Rust
#   bindings), python3-pip and unzip (to fetch ONNX Runtime from PyPI), curl (scripts),
#   libffmpeg-nvenc-dev (NVIDIA's codec headers: FFmpeg's NVDEC decoding, loaded at run
#   time, so neither this machine nor the one that runs the binary needs CUDA);
# - the pinned ONNX Runtime library, into .cache/onnxruntime/;
# - a minimal static FFmpeg for video decoding, into .cache/ffmpeg/ (scripts/fetch-ffmpeg.sh).
# Safe to run again: it only installs what is missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v nasm >/dev/null 2>&1 || missing+=(nasm)
command -v unzip >/dev/null 2>&1 || missing+=(unzip)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v cc >/dev/null 2>&1 || missing+=(build-essential)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v xz >/dev/null 2>&1 || missing+=(xz-utils)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
for package in libclang-dev libffmpeg-nvenc-dev; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    sudo_if_needed apt-get update -qq
    DEBIAN_FRONTEND=noninteractive sudo_if_needed apt-get install -y -qq "${missing[@]}" >/dev/null
fi

"$root/scripts/fetch-onnxruntime.sh"
"$root/scripts/fetch-ffmpeg.sh"

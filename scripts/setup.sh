#!/usr/bin/env bash
# Everything a fresh Debian/Ubuntu machine with Rust needs before `cargo build`:
# - system packages: cmake and nasm (libjpeg-turbo is built from source and linked
#   statically), python3-pip and unzip (to fetch ONNX Runtime from PyPI), curl (scripts);
# - the pinned ONNX Runtime library, into .cache/onnxruntime/.
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
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    sudo_if_needed apt-get update -qq
    DEBIAN_FRONTEND=noninteractive sudo_if_needed apt-get install -y -qq "${missing[@]}" >/dev/null
fi

"$root/scripts/fetch-onnxruntime.sh"

#!/usr/bin/env bash
# Fetches the pinned ONNX Runtime CPU library into .cache/onnxruntime/<version>/, where the
# peregrine binary looks for it. The library comes from the PyPI `onnxruntime` wheel (its
# .so does not depend on the Python version), checked against a pinned SHA-256.
# Idempotent: does nothing when the library is already there.
set -euo pipefail

ORT_VERSION=1.31.1
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.cache/onnxruntime/$ORT_VERSION"
lib="libonnxruntime.so.$ORT_VERSION"

if [ -f "$dest/$lib" ]; then
    exit 0
fi

case "$(uname -m)" in
    x86_64)
        platform=manylinux_2_28_x86_64
        sha256=5752bd508126ae7c49894d3b9d2e83f0c3d487319246d04c444b393308d7ad7f ;;
    aarch64)
        platform=manylinux_2_27_aarch64
        sha256="" ;;
    *)
        echo "fetch-onnxruntime: no ONNX Runtime wheel for $(uname -m); set ORT_DYLIB_PATH to your own libonnxruntime.so" >&2
        exit 1 ;;
esac

sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# pip downloads the wheel (it honours the machine's index and proxy settings); unzip opens it.
if ! python3 -m pip --version >/dev/null 2>&1 || ! command -v unzip >/dev/null 2>&1; then
    echo "fetch-onnxruntime: installing python3-pip and unzip" >&2
    sudo_if_needed apt-get update -qq
    sudo_if_needed apt-get install -y -qq python3-pip unzip >/dev/null
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "fetch-onnxruntime: downloading onnxruntime $ORT_VERSION ($platform) from PyPI" >&2
python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --platform "$platform" --python-version 3.11 --implementation cp \
    --dest "$tmp" "onnxruntime==$ORT_VERSION"
wheel="$(ls "$tmp"/onnxruntime-*.whl)"
if [ -n "$sha256" ]; then
    echo "$sha256  $wheel" | sha256sum --check --quiet - || {
        echo "fetch-onnxruntime: checksum mismatch for $wheel" >&2
        exit 1
    }
fi
unzip -q -j -o "$wheel" "onnxruntime/capi/$lib" "onnxruntime/capi/libonnxruntime_providers_shared.so" -d "$tmp/lib"
mkdir -p "$dest"
cp "$tmp/lib/"* "$dest/"
ln -sf "$lib" "$dest/libonnxruntime.so"
echo "fetch-onnxruntime: installed $dest/$lib" >&2

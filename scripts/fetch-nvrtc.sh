#!/bin/sh
# fetch-nvrtc.sh [CACHE_DIR]
#
# NVIDIA's run-time CUDA compiler, NVRTC (PyPI wheel nvidia-cuda-nvrtc-cu12==12.9.86,
# sha256-checked), unpacked into CACHE_DIR (default ./.cache/nvrtc): libnvrtc.so.12 and the
# libnvrtc-builtins it loads. No GPU and no driver are needed to compile with it, so the
# test suite uses it to compile the GPU kernels' source (crates/backend/src/cuda/kernel.rs)
# on machines without a GPU: a kernel that does not compile fails CI, not the GPU run.
# The server itself never uses this copy (the GPU machine's CUDA installation has its own).
# Idempotent: nothing is fetched when both libraries are there.
# Download: 89.6 MB; on disk 113 MB.
set -eu

CACHE=${1:-./.cache/nvrtc}
# A Python with pip (Debian's python3 has none: setup-test.sh passes its venv's).
PYTHON=${PYTHON:-python3}
VERSION=12.9.86
WHEEL=nvidia_cuda_nvrtc_cu12-$VERSION-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl
WHEEL_SHA256=210cf05005a447e29214e9ce50851e83fc5f4358df8b453155d5e1918094dcb4

if [ -f "$CACHE/libnvrtc.so.12" ] && [ -f "$CACHE/libnvrtc-builtins.so.12.9" ]; then
    exit 0
fi
mkdir -p "$CACHE"
download="$CACHE/download"
mkdir -p "$download"
if [ ! -f "$download/$WHEEL" ]; then
    echo "fetch-nvrtc: downloading NVRTC $VERSION (90 MB, PyPI)" >&2
    "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
        --platform manylinux2010_x86_64 --python-version 3 \
        -d "$download" "nvidia-cuda-nvrtc-cu12==$VERSION"
fi
echo "$WHEEL_SHA256  $download/$WHEEL" | sha256sum -c --quiet -
"$PYTHON" - "$download/$WHEEL" "$CACHE" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for name in ("libnvrtc.so.12", "libnvrtc-builtins.so.12.9"):
        data = z.read("nvidia/cuda_nvrtc/lib/" + name)
        with open(f"{out}/{name}", "wb") as f:
            f.write(data)
PY
rm -rf "$download"

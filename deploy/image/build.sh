#!/usr/bin/env bash
# `make image`: builds Peregrine's container image without a daemon or a registry.
#   1. The base: a minimal Debian 12 root filesystem made from Debian's packages by
#      mmdebstrap (ca-certificates and curl, for the healthcheck), cached as a tarball and
#      imported once as localhost/peregrine-base:bookworm.
#   2. The build context in target/image/context: the release binary (built by `make image`
#      first, without its debug sections), ONNX Runtime's library (scripts/fetch-onnxruntime.sh),
#      the licences.
#   3. buildah with chroot isolation builds deploy/image/Containerfile (docker format, which
#      keeps the HEALTHCHECK; OCI's image format has none), then the image is also written
#      as target/image/peregrine.tar, which `docker load` and `podman load` read.
# GPU=1 builds Containerfile.gpu instead: NVIDIA's CUDA base (pulled from its registry, so
# on a machine that reaches it) and ONNX Runtime's GPU build from the pinned onnxruntime-gpu
# wheel; tagged <version>-cuda, saved as target/image/peregrine-cuda.tar.
# Settings (env): IMAGE (tag, default localhost/peregrine:<version>[-cuda]), BINARY
# (default target/release/peregrine), IMAGE_CACHE (where the Debian base tarball and the
# wheel are kept, default .cache/image), GPU_BASE (the CUDA base image), STORAGE_DRIVER (containers-storage driver, default vfs: works inside
# containers and VMs where overlay does not), DEBIAN_MIRROR, SAVE=0 to skip the archive.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

ort_version=1.31.1
# onnxruntime-gpu's manylinux_2_28 x86_64 wheel (the .so files do not depend on Python's version).
ort_gpu_wheel=onnxruntime_gpu-$ort_version-cp312-cp312-manylinux_2_28_x86_64.whl
ort_gpu_sha256=05d548956197b9d01f59b625de740e0d6be3593f874e241a12dc0362650ecdf7
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
gpu=${GPU:-0}
suffix=$([ "$gpu" = 1 ] && echo -cuda || true)
image=${IMAGE:-localhost/peregrine:$version$suffix}
storage=(--storage-driver "${STORAGE_DRIVER:-vfs}")
binary=${BINARY:-target/release/peregrine}
out=target/image
context="$out/context$suffix"
cache=${IMAGE_CACHE:-.cache/image}

install_tools() {
    local missing=()
    for tool in mmdebstrap buildah podman; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "image: installing ${missing[*]}" >&2
        sudo_if_needed apt-get update -qq
        DEBIAN_FRONTEND=noninteractive sudo_if_needed apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

# The Debian base, made once; prints its image name.
debian_base() {
    local name=localhost/peregrine-base:bookworm
    local tar="$cache/debian-bookworm-minbase.tar"
    local mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
    if [ ! -f "$tar" ]; then
        echo "image: making the Debian 12 base with mmdebstrap from $mirror" >&2
        mkdir -p "$(dirname "$tar")"
        # Documentation and translations are left out; copyright files stay (licences).
        mmdebstrap --variant=minbase --include=ca-certificates,curl \
            --dpkgopt='path-exclude=/usr/share/man/*' \
            --dpkgopt='path-exclude=/usr/share/doc/*' \
            --dpkgopt='path-include=/usr/share/doc/*/copyright' \
            --dpkgopt='path-exclude=/usr/share/locale/*' \
            bookworm "$tar.partial" "$mirror" >&2
        mv "$tar.partial" "$tar"
    fi
    if ! podman "${storage[@]}" image exists "$name"; then
        podman "${storage[@]}" import "$tar" "$name" >/dev/null
    fi
    echo "$name"
}

# ONNX Runtime's GPU libraries from the pinned wheel, into the build context.
stage_ort_gpu() {
    local wheels="$cache/wheels"
    if [ ! -f "$wheels/$ort_gpu_wheel" ]; then
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 \
            "onnxruntime-gpu==$ort_version" -d "$wheels"
    fi
    echo "$ort_gpu_sha256  $wheels/$ort_gpu_wheel" | sha256sum -c --quiet \
        || { echo "image: $wheels/$ort_gpu_wheel does not match its pinned SHA-256" >&2; exit 1; }
    unzip -q -j -o "$wheels/$ort_gpu_wheel" "onnxruntime/capi/libonnxruntime.so.$ort_version" \
        'onnxruntime/capi/libonnxruntime_providers_*.so' -d "$context"
}

install_tools
[ -x "$binary" ] || { echo "image: $binary is missing: run \`make build\` first" >&2; exit 1; }
rm -rf "$context"
mkdir -p "$context"
# The release profile keeps line tables for profiling (debug = 1): 146 MB instead of 41.
# The image keeps the symbols, so panics still name their functions.
strip --strip-debug -o "$context/peregrine" "$binary"
cp models/NOTICE LICENSE "$context/"
if [ "$gpu" = 1 ]; then
    containerfile=deploy/image/Containerfile.gpu
    stage_ort_gpu
    base_args=(${GPU_BASE:+--build-arg "BASE=$GPU_BASE"})
else
    containerfile=deploy/image/Containerfile
    ./scripts/fetch-onnxruntime.sh
    cp ".cache/onnxruntime/$ort_version/libonnxruntime.so.$ort_version" "$context/"
    base_args=(--build-arg "BASE=$(debian_base)")
fi
buildah "${storage[@]}" bud --isolation chroot --format docker --layers=false \
    "${base_args[@]}" --build-arg "ORT_VERSION=$ort_version" -f "$containerfile" -t "$image" "$context"
if [ "${SAVE:-1}" != 0 ]; then
    archive="$out/peregrine$suffix.tar"
    rm -f "$archive"
    podman "${storage[@]}" save --format docker-archive -o "$archive" "$image"
    echo "image: $image, saved as $archive ($(du -m "$archive" | cut -f1) MiB)" >&2
fi

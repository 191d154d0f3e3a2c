#!/usr/bin/env bash
# `make image`: builds Peregrine's container image without a daemon or a registry.
#   1. The base: a minimal Debian 12 root filesystem made from Debian's packages by
#      mmdebstrap (ca-certificates and curl, for the healthcheck), cached as a tarball in
#      .cache/image/ and imported once as localhost/peregrine-base:bookworm.
#   2. The build context in target/image/context: the release binary (built by `make image`
#      first, without its debug sections), ONNX Runtime's library (scripts/fetch-onnxruntime.sh), the licences.
#   3. buildah with chroot isolation builds deploy/image/Containerfile (docker format, which
#      keeps the HEALTHCHECK; OCI's image format has none), then the image is also written
#      as target/image/peregrine.tar, which `docker load` and `podman load` read.
# Settings (env): IMAGE (tag, default localhost/peregrine:<version>), BINARY (default
# target/release/peregrine), BASE_TAR (the cached base, default in .cache/image), STORAGE_DRIVER
# (containers-storage driver, default vfs: works inside containers and VMs where overlay
# does not), DEBIAN_MIRROR, SAVE=0 to skip the archive.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

ort_version=1.31.1
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
image=${IMAGE:-localhost/peregrine:$version}
base_image=localhost/peregrine-base:bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
storage=(--storage-driver "${STORAGE_DRIVER:-vfs}")
binary=${BINARY:-target/release/peregrine}
out=target/image

missing=()
for tool in mmdebstrap buildah podman; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "image: installing ${missing[*]}" >&2
    sudo_if_needed apt-get update -qq
    DEBIAN_FRONTEND=noninteractive sudo_if_needed apt-get install -y -qq "${missing[@]}" >/dev/null
fi
[ -x "$binary" ] || { echo "image: $binary is missing: run \`make build\` first" >&2; exit 1; }
./scripts/fetch-onnxruntime.sh

base_tar=${BASE_TAR:-.cache/image/debian-bookworm-minbase.tar}
if [ ! -f "$base_tar" ]; then
    echo "image: making the Debian 12 base with mmdebstrap from $mirror" >&2
    mkdir -p "$(dirname "$base_tar")"
    # Documentation and translations are left out; copyright files stay (licences).
    mmdebstrap --variant=minbase --include=ca-certificates,curl \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        bookworm "$base_tar.partial" "$mirror"
    mv "$base_tar.partial" "$base_tar"
fi
if ! podman "${storage[@]}" image exists "$base_image"; then
    podman "${storage[@]}" import "$base_tar" "$base_image" >/dev/null
fi

context="$out/context"
rm -rf "$context"
mkdir -p "$context"
# The release profile keeps line tables for profiling (debug = 1): 146 MB instead of 41.
# The image keeps the symbols, so panics still name their functions.
strip --strip-debug -o "$context/peregrine" "$binary"
cp ".cache/onnxruntime/$ort_version/libonnxruntime.so.$ort_version" "$context/"
cp models/NOTICE LICENSE deploy/image/Containerfile "$context/"
buildah "${storage[@]}" bud --isolation chroot --format docker --layers=false \
    --build-arg "BASE=$base_image" --build-arg "ORT_VERSION=$ort_version" -f "$context/Containerfile" -t "$image" "$context"
if [ "${SAVE:-1}" != 0 ]; then
    rm -f "$out/peregrine.tar"
    podman "${storage[@]}" save --format docker-archive -o "$out/peregrine.tar" "$image"
    echo "image: $image, saved as $out/peregrine.tar ($(du -m "$out/peregrine.tar" | cut -f1) MiB)" >&2
fi

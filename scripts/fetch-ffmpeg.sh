#!/usr/bin/env bash
# The video decoder Peregrine links: a minimal static FFmpeg (H.264 and H.265 decoders and
# parsers, their NVDEC hardware decoding, swscale), built from Debian's pinned source tarball into .cache/ffmpeg/<version>/
# (where .cargo/config.toml points ffmpeg-sys-next), so the binary needs no FFmpeg on the
# machine that runs it. Needs a C compiler, nasm, make, xz and libclang (bindgen reads
# FFmpeg's headers through it) and NVIDIA's codec headers (libffmpeg-nvenc-dev), which
# scripts/setup.sh installs. About 2.5 minutes on two
# cores, once; a finished build is kept.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
now() { date +%s; }

# --- static FFmpeg ---------------------------------------------------------------------
# Debian 12's FFmpeg (the upstream release its package ships), from Debian's mirror.
ffmpeg_version=5.1.9
ffmpeg_sha256=d9b593bb2ba93d4b50f74177e0cdcd41747e708596367deed0c30348a71dd176
ffmpeg_url="https://deb.debian.org/debian/pool/main/f/ffmpeg/ffmpeg_${ffmpeg_version}.orig.tar.xz"
# The flavour names the build's configuration, so a changed one is rebuilt beside the old
# (.cargo/config.toml names the same directory).
flavour=nvdec
cache="$root/.cache/ffmpeg"
prefix="$cache/$ffmpeg_version-$flavour"
if [ ! -f "$prefix/.complete" ]; then
    started=$(now)
    mkdir -p "$cache"
    tarball="$cache/ffmpeg_${ffmpeg_version}.orig.tar.xz"
    if ! echo "$ffmpeg_sha256  $tarball" | sha256sum -c --status 2>/dev/null; then
        echo "fetch-ffmpeg: fetching $ffmpeg_url" >&2
        curl -fsSL --retry 3 -o "$tarball.part" "$ffmpeg_url"
        echo "$ffmpeg_sha256  $tarball.part" | sha256sum -c --status \
            || { echo "fetch-ffmpeg: checksum mismatch for $ffmpeg_url" >&2; exit 1; }
        mv "$tarball.part" "$tarball"
    fi
    src="$cache/src-$ffmpeg_version"
    rm -rf "$src" "$prefix"
    mkdir -p "$src"
    tar -xJf "$tarball" -C "$src" --strip-components=1
    echo "fetch-ffmpeg: building FFmpeg $ffmpeg_version (decoders only) into $prefix" >&2
    # Only what the decoder path uses: H.264/H.265 decoders and parsers, swscale for RGB,
    # pthreads for frame threading. --disable-autodetect keeps out every system library
    # (the binary must run where none of them are installed); PIC so it links into a PIE.
    # NVDEC (hwaccels h264_nvdec, hevc_nvdec and the CUDA frames they decode into) comes
    # from the ffnvcodec headers alone: FFmpeg dlopens libcuda and libnvcuvid when a
    # decoder asks for it, so machines without a GPU run the same binary.
    (
        cd "$src"
        ./configure --prefix="$prefix" \
            --disable-everything --disable-autodetect --disable-programs --disable-doc \
            --disable-avformat --disable-avdevice --disable-avfilter --disable-swresample \
            --disable-postproc --disable-network --disable-debug \
            --enable-decoder=h264,hevc --enable-parser=h264,hevc \
            --enable-ffnvcodec --enable-nvdec --enable-hwaccel=h264_nvdec,hevc_nvdec \
            --enable-swscale --enable-pthreads \
            --enable-pic --enable-static --disable-shared >"$cache/configure-$ffmpeg_version.log"
        make -j"$(nproc)" >"$cache/make-$ffmpeg_version.log" 2>&1
        make install >>"$cache/make-$ffmpeg_version.log" 2>&1
    )
    rm -rf "$src"
    touch "$prefix/.complete"
    echo "fetch-ffmpeg: FFmpeg built in $(( $(now) - started )) s" >&2
fi

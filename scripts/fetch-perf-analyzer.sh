#!/bin/sh
# fetch-perf-analyzer.sh [CACHE_DIR]
#
# Makes NVIDIA perf_analyzer 2.60.0 (PyPI wheel perf-analyzer==2.60.0, a single C++ binary that needs
# glibc >= 2.38 and GLIBCXX_3.4.32) runnable on an older host such as Debian 12 (glibc 2.36) without
# touching the system glibc, and writes an executable wrapper CACHE_DIR/perf_analyzer.
#
#  * glibc >= 2.38 on the host and the binary runs as is (e.g. Ubuntu 24.04)  -> wrapper execs it directly.
#  * otherwise -> pinned Debian 13 "trixie" runtime packages (libc6, libstdc++6, libgcc-s1, libssl3t64,
#    libzstd1, zlib1g) are downloaded from deb.debian.org, sha256-checked, unpacked with dpkg-deb -x into
#    CACHE_DIR/sysroot, and the wrapper runs the binary through that sysroot's dynamic loader:
#      sysroot/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --library-path sysroot/usr/lib/x86_64-linux-gnu ...
#
# Idempotent: files already present with the right sha256 are not fetched again; the sysroot is only
# re-extracted when the package set changes. The cache directory can be moved afterwards (the wrapper
# locates everything relative to itself).
#
# Needs: POSIX sh + coreutils (readlink -f, dirname), curl, python3 (wheel unzip, sha256, fallback index
# parsing; `python3 -m pip download` is used when pip is there, else curl fetches the pinned PyPI URL),
# dpkg-deb (only for the private runtime), getconf or ldd (glibc version). xz is not needed (python3's lzma
# reads Packages.xz in the fallback). Optional: gpgv + debian-archive-keyring (fallback only, to verify
# InRelease; Debian 12's keyring already holds the trixie keys).
# Download: wheel 7,182,673 B + six .debs 6,493,800 B = 13,676,473 B; on disk ~58 MB (20 MB binary,
# 24 MB sysroot, 14 MB kept downloads).
#
# If a pinned .deb has vanished from the mirror (Debian drops superseded stable versions at each point
# release), the script falls back to resolving the current version from the suite's Packages index
# (InRelease -> gpgv if available -> Packages.xz sha256 -> .deb sha256) and prints a warning so the
# pins can be updated. Set PA_NO_FALLBACK=1 to forbid that; PA_FORCE_SYSROOT=1 to use the private
# runtime even on a new-enough host; PA_MIRROR to use another Debian mirror URL.
set -eu

CACHE=${1:-./.cache/perf-analyzer}
MIRROR=${PA_MIRROR:-https://deb.debian.org/debian}
SUITE=trixie

PA_VERSION=2.60.0
WHEEL=perf_analyzer-2.60.0-py3-none-manylinux_2_38_x86_64.whl
WHEEL_URL=https://files.pythonhosted.org/packages/f5/9c/01f1f189aa22f060d603a8de131836b834b0e5159a36bb7b44c980d60aeb/$WHEEL
WHEEL_SHA256=23ef56b107ae9233e5cf09fbdf508dd9b936a52f1bae2f63f53c8117087b3f25

# package  version  pool-path  size  sha256   (Debian 13.8 "trixie", main, amd64; Packages index of 2026-11-21)
PINS='libc6 2.41-12+deb13u5 pool/main/g/glibc/libc6_2.41-12+deb13u5_amd64.deb 2850108 b59b0625cd1a791375d40dab23a4d5d3d0641e3d0a773501becdc3725b7f99cf
libgcc-s1 14.2.0-19 pool/main/g/gcc-14/libgcc-s1_14.2.0-19_amd64.deb 72772 3c71917b490d1a17aed43196a2787a256ecf060526cdb20216a74bedc061b150
libstdc++6 14.2.0-19 pool/main/g/gcc-14/libstdc++6_14.2.0-19_amd64.deb 713628 ab1fa05837aa7a92aae748fd07a18a35f7d18bb4a71c4724fe2bbf0e32089de0
libssl3t64 3.5.9-1~deb13u1 pool/main/o/openssl/libssl3t64_3.5.9-1~deb13u1_amd64.deb 2464736 ffefb9af363e0e4592251b2533eb06453c8e470f7772e40263c4b2129251a6d5
libzstd1 1.5.7+dfsg-1 pool/main/libz/libzstd/libzstd1_1.5.7+dfsg-1_amd64.deb 303836 2f6a2aeacfc925eba8b00ac9139bc4bfccf8cacb09eb93de067074b26948eef9
zlib1g 1:1.3.dfsg+really1.3.1-1+deb13u1 pool/main/z/zlib/zlib1g_1.3.dfsg+really1.3.1-1+deb13u1_amd64.deb 88720 8c27c342230503b73dfde629642c3b352e87b554e06d60cf58772f236a305ceb'

say() { echo "fetch-perf-analyzer: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

[ "$(uname -m)" = x86_64 ] || die "only x86_64 is supported (this wheel is manylinux_2_38_x86_64)"
for t in curl python3; do command -v $t >/dev/null 2>&1 || die "$t is required"; done

mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
mkdir -p "$CACHE/downloads"

sha256_of() { python3 -c 'import hashlib,sys;h=hashlib.sha256()
with open(sys.argv[1],"rb") as f:
    for b in iter(lambda:f.read(1<<20),b""): h.update(b)
print(h.hexdigest())' "$1"; }

have_ok() { [ -f "$1" ] && [ "$(sha256_of "$1")" = "$2" ]; }

fetch() {  # url dest sha256  -> 0 ok, 2 HTTP 404/410, 1 other failure
    tmp="$2.part.$$"
    code=$(curl -sSL --retry 3 --connect-timeout 20 -o "$tmp" -w '%{http_code}' "$1" || true)
    case "$code" in
        200) ;;
        404|410) rm -f "$tmp"; return 2 ;;
        *) rm -f "$tmp"; say "download failed (HTTP ${code:-none}): $1"; return 1 ;;
    esac
    got=$(sha256_of "$tmp")
    if [ "$got" != "$3" ]; then rm -f "$tmp"; say "sha256 mismatch for $1: got $got want $3"; return 1; fi
    mv -f "$tmp" "$2"
}

# ---------------------------------------------------------------- 1. the wheel and the binary
W="$CACHE/downloads/$WHEEL"
if have_ok "$W" "$WHEEL_SHA256"; then
    say "wheel present: $WHEEL"
else
    rm -f "$W"
    if python3 -m pip --version >/dev/null 2>&1; then
        say "pip download perf-analyzer==$PA_VERSION (platform manylinux_2_38_x86_64)"
        python3 -m pip download --no-deps --only-binary=:all: --platform manylinux_2_38_x86_64 \
            --python-version 3.12 --implementation py --abi none "perf-analyzer==$PA_VERSION" \
            -d "$CACHE/downloads" >&2 || say "pip download failed, trying curl"
    fi
    if ! have_ok "$W" "$WHEEL_SHA256"; then
        rm -f "$W"
        say "curl $WHEEL_URL"
        fetch "$WHEEL_URL" "$W" "$WHEEL_SHA256" || die "could not download $WHEEL"
    fi
fi

BIN="$CACHE/bin/perf_analyzer"
if [ ! -x "$BIN" ] || [ "$(cat "$CACHE/bin/.wheel-sha256" 2>/dev/null)" != "$WHEEL_SHA256" ]; then
    say "extracting perf_analyzer/bin/perf_analyzer from the wheel"
    mkdir -p "$CACHE/bin"
    python3 - "$W" "$BIN.part" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("perf_analyzer/bin/perf_analyzer") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
    chmod 755 "$BIN.part"
    mv -f "$BIN.part" "$BIN"
    echo "$WHEEL_SHA256" > "$CACHE/bin/.wheel-sha256"
fi

# ---------------------------------------------------------------- 2. does the host glibc suffice?
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}') || true
[ -n "$glibc" ] || glibc=$(ldd --version 2>/dev/null | head -n1 | awk '{print $NF}') || true
glibc_new_enough() {
    [ -n "$glibc" ] || return 1
    python3 -c 'import sys; v=tuple(int(x) for x in sys.argv[1].split(".")[:2]); sys.exit(0 if v >= (2,38) else 1)' "$glibc" 2>/dev/null
}

write_wrapper() {  # $1 = direct|sysroot
    tmp="$CACHE/perf_analyzer.part.$$"
    if [ "$1" = direct ]; then
        cat > "$tmp" <<'EOF'
#!/bin/sh
# generated by fetch-perf-analyzer.sh: host glibc is new enough, run perf_analyzer 2.60.0 directly
here=$(dirname "$(readlink -f "$0")")
exec "$here/bin/perf_analyzer" "$@"
EOF
    else
        cat > "$tmp" <<'EOF'
#!/bin/sh
# generated by fetch-perf-analyzer.sh: run perf_analyzer 2.60.0 through a private Debian 13 glibc/libstdc++
# (the system glibc is too old). --library-path replaces LD_LIBRARY_PATH for this process only.
here=$(dirname "$(readlink -f "$0")")
lib="$here/sysroot/usr/lib/x86_64-linux-gnu"
GCONV_PATH="$lib/gconv"; export GCONV_PATH
exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib" --argv0 "$0" "$here/bin/perf_analyzer" "$@"
EOF
    fi
    chmod 755 "$tmp"
    mv -f "$tmp" "$CACHE/perf_analyzer"
}

self_test() {
    out=$("$CACHE/perf_analyzer" --version 2>&1) || true
    case "$out" in
        *"Perf Analyzer Version"*) say "ok: $CACHE/perf_analyzer ($1) -> $out"; return 0 ;;
        *) say "self-test failed ($1): $out"; return 1 ;;
    esac
}

if [ "${PA_FORCE_SYSROOT:-0}" != 1 ] && glibc_new_enough; then
    say "host glibc $glibc >= 2.38: trying the binary directly"
    write_wrapper direct
    if self_test direct; then exit 0; fi
    say "the binary does not run directly on this host (missing libssl3/zlib/libstdc++?), using a private runtime"
else
    say "host glibc ${glibc:-unknown} < 2.38 (or PA_FORCE_SYSROOT=1): using a private Debian $SUITE runtime"
fi

# ---------------------------------------------------------------- 3. private runtime from Debian packages
command -v dpkg-deb >/dev/null 2>&1 || die "dpkg-deb is required for the private runtime"

RESOLVED="$CACHE/downloads/resolved.txt"   # lines: file sha256 (what was actually used)
: > "$RESOLVED.new"
fallback_pkg() {  # pkg -> prints "pool-path sha256" of the suite's current version
    python3 - "$MIRROR" "$SUITE" "$1" "$CACHE/downloads" <<'EOF'
import hashlib, lzma, os, re, shutil, subprocess, sys, urllib.request
mirror, suite, pkg, d = sys.argv[1:5]
def get(url):
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.read()
inrel = get(f"{mirror}/dists/{suite}/InRelease")
p = os.path.join(d, f"{suite}-InRelease"); open(p, "wb").write(inrel)
kr = "/usr/share/keyrings/debian-archive-keyring.gpg"
if shutil.which("gpgv") and os.path.exists(kr):
    r = subprocess.run(["gpgv", "--keyring", kr, p], capture_output=True)
    if r.returncode != 0:
        sys.exit("InRelease signature check failed: " + r.stderr.decode())
    print("fallback: InRelease signature OK (gpgv)", file=sys.stderr)
else:
    print("fallback: WARNING gpgv/keyring missing, InRelease NOT signature-checked (HTTPS only)", file=sys.stderr)
text = inrel.decode()
sha_sec = text.split("\nSHA256:\n", 1)[1]
m = re.search(r"^ ([0-9a-f]{64})\s+(\d+)\s+main/binary-amd64/Packages\.xz$", sha_sec, re.M)
want = m.group(1)
px = get(f"{mirror}/dists/{suite}/main/binary-amd64/Packages.xz")
if hashlib.sha256(px).hexdigest() != want:
    sys.exit("Packages.xz sha256 mismatch")
for para in lzma.decompress(px).decode().split("\n\n"):
    f = dict(re.findall(r"^([A-Za-z0-9-]+): (.*)$", para, re.M))
    if f.get("Package") == pkg:
        print(f["Filename"], f["SHA256"], f["Version"])
        break
else:
    sys.exit(f"package {pkg} not in {suite}")
EOF
}

echo "$PINS" | while read -r pkg ver path size sha; do
    f="$CACHE/downloads/$(basename "$path")"
    if have_ok "$f" "$sha"; then
        echo "$(basename "$path") $sha" >> "$RESOLVED.new"; continue
    fi
    say "downloading $pkg $ver ($size bytes)"
    rc=0; fetch "$MIRROR/$path" "$f" "$sha" || rc=$?
    if [ $rc -eq 0 ]; then echo "$(basename "$path") $sha" >> "$RESOLVED.new"; continue; fi
    [ $rc -eq 2 ] || die "could not download $MIRROR/$path"
    [ "${PA_NO_FALLBACK:-0}" != 1 ] || die "$pkg $ver is gone from the mirror and PA_NO_FALLBACK=1"
    # pinned version superseded: look up the current one (verified through the signed index)
    ans=$(fallback_pkg "$pkg") || die "fallback lookup for $pkg failed"
    set -- $ans
    say "WARNING: pinned $pkg $ver no longer on the mirror; using $SUITE's current $3 (update the pins)"
    f="$CACHE/downloads/$(basename "$1")"
    have_ok "$f" "$2" || fetch "$MIRROR/$1" "$f" "$2" || die "could not download $MIRROR/$1"
    echo "$(basename "$1") $2" >> "$RESOLVED.new"
done
mv -f "$RESOLVED.new" "$RESOLVED"

SYS="$CACHE/sysroot"
if [ -x "$SYS/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" ] && cmp -s "$RESOLVED" "$SYS/.packages" 2>/dev/null; then
    say "sysroot up to date"
else
    say "extracting packages into $SYS"
    rm -rf "$SYS.part"
    mkdir -p "$SYS.part"
    while read -r deb sha; do
        dpkg-deb -x "$CACHE/downloads/$deb" "$SYS.part"
    done < "$RESOLVED"
    # not needed at run time: docs, gdb helpers
    rm -rf "$SYS.part/usr/share/doc" "$SYS.part/usr/share/lintian" "$SYS.part/usr/share/gdb"
    cp "$RESOLVED" "$SYS.part/.packages"
    rm -rf "$SYS"
    mv "$SYS.part" "$SYS"
fi

write_wrapper sysroot
self_test sysroot || die "perf_analyzer does not start through the private loader"

#!/usr/bin/env bash
# Fuzzes the parsers that read untrusted bytes (fuzz/fuzz_targets: KServe REST bodies, gRPC
# inference messages, uploaded images, ONNX model files, pushed RTP: packets and the jitter
# buffer, H.264/H.265 depacketization, MPEG-PS; GB28181 SIP with its digest credentials,
# MANSCDP bodies and SDP answers) with cargo-fuzz and libFuzzer, on the stable toolchain
# (`--sanitizer none`: panics, hangs, huge allocations and overflows found; no
# AddressSanitizer, which needs nightly, and the Rust code is safe but for the reviewed FFI).
# Each target runs FUZZ_SECONDS (default 60) from its checked-in seeds (fuzz/seeds/<target>)
# plus the corpus kept in .cache/fuzz/<target>. A crash stops the script; the input that
# caused it is left in fuzz/artifacts/<target>/.
#
#   scripts/fuzz.sh                      # every target, 60 s each
#   FUZZ_SECONDS=600 scripts/fuzz.sh decode_image
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
./scripts/setup.sh
# Kept per user, outside the checkout, like `cargo install`'s own tools: a fresh clone (CI's)
# on the same machine does not build it again.
tools="${PEREGRINE_TOOLS_DIR:-$HOME/.cache/peregrine-tools}/cargo-fuzz"
if [ ! -x "$tools/bin/cargo-fuzz" ]; then
    cargo install cargo-fuzz --version 0.13.2 --locked --root "$tools"
fi
export PATH="$tools/bin:$PATH"
seconds="${FUZZ_SECONDS:-60}"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(kserve_rest grpc_infer decode_image onnx_rewrite rtp_packet rtp_depacketize ps_demux sip_message)
for target in "${targets[@]}"; do
    corpus="$root/.cache/fuzz/$target"
    mkdir -p "$corpus"
    echo "fuzz: $target for ${seconds} s" >&2
    cargo fuzz run --sanitizer none "$target" "$corpus" "fuzz/seeds/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
done

#!/usr/bin/env bash
# Capacity of this machine for 720p25 camera streams (bigbuckbunny.mp4 looped at its own
# rate): decode only (a zero-cost detector) and with the CPU model, at 5 fps per stream and
# at every frame, through the video crate's pipeline alone (no HTTP server; the server-level
# sweep is scripts/bench-video.py). Prints one table per case; record them with the machine
# and date. STREAMS, CPU_STREAMS and SECONDS_PER_RUN override the sweep, e.g.
# STREAMS=1,2,4 SECONDS_PER_RUN=10.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
./scripts/setup.sh
cargo build --release -p peregrine-video --example capacity
bin=target/release/examples/capacity
streams="${STREAMS:-4,8,12,16,20}"
seconds="${SECONDS_PER_RUN:-15}"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for fps in 5 0; do
    "$bin" --detector fake --fps "$fps" --streams "$streams" --seconds "$seconds" | sed -n '/^| streams/,$p'
done
for fps in 5 0; do
    "$bin" --detector cpu --fps "$fps" --streams "${CPU_STREAMS:-1,2,3,4}" --seconds "$seconds" \
        | sed -n '/^| streams/,$p'
done

#!/usr/bin/env bash
# The test suite: every crate's unit tests and the integration tests (which start the real
# binary and server). Ends with one summary line, "N passed, N failed, N skipped".
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
cargo test --workspace --locked "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
awk '/^test result:/ { p += $4; f += $6; s += $8 } END { printf "%d passed, %d failed, %d skipped\n", p, f, s }' "$log"
exit "$status"

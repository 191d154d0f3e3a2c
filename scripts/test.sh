#!/usr/bin/env bash
# The test suite: every crate's unit tests and the integration tests (which start the real
# binary and server), then Triton's own clients and perf_analyzer against the real server
# (tests/triton) and the video pipeline end to end against real cameras and an MQTT broker
# (tests/video), the Kubernetes manifests against their schemas and the alert rules and
# dashboard queries with promtool (tests/deploy), the web console in Chromium
# (tests/console), with the
# environment scripts/setup-test.sh prepares. Keeps each test
# binary's and pytest's wall time in target/test-durations.tsv and prints the ten slowest,
# so CI time can be watched as suites grow. Ends with one summary line,
# "N passed, N failed, N skipped".
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
log="$(mktemp)"
pylog="$(mktemp)"
trap 'rm -f "$log" "$pylog"' EXIT
cargo test --workspace --locked --no-fail-fast "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
# The client suite runs the debug binary the integration tests just built.
PEREGRINE_BIN="$root/target/debug/peregrine" .cache/venv/bin/python -m pytest -q -p no:cacheprovider tests/triton tests/video tests/deploy tests/security tests/console 2>&1 | tee "$pylog"
pystatus=${PIPESTATUS[0]}
# Seconds and name of each test binary (from cargo's "Running" line and its "finished in"),
# then the client suite's total (from pytest's last line).
durations="$root/target/test-durations.tsv"
awk -v py="$(tail -n 1 "$pylog")" '
    /^ *Running / {
        name = $0; sub(/^ *Running /, "", name)
        bin = name; sub(/^.*deps\//, "", bin); sub(/-[0-9a-f]+\)$/, "", bin)
        sub(/ \(.*$/, "", name); current = bin " " name
    }
    /^ *Doc-tests / { current = "doc-tests " $2 }
    /^test result:/ && match($0, /finished in [0-9.]+s/) {
        printf "%.2f\t%s\n", substr($0, RSTART + 12, RLENGTH - 13), current
    }
    END {
        if (match(py, / in [0-9.]+s/)) printf "%.2f\tpytest tests/triton tests/video tests/deploy tests/security tests/console\n", substr(py, RSTART + 4, RLENGTH - 5)
    }' "$log" | sort -rn >"$durations"
echo "slowest test binaries (seconds; all in $durations):"
head -n 10 "$durations" | awk -F '\t' '{ printf "%9.2f  %s\n", $1, $2 }'
awk -v py="$(tail -n 1 "$pylog")" '
    /^test result:/ { p += $4; f += $6; s += $8 }
    END {
        if (match(py, /[0-9]+ passed/)) p += substr(py, RSTART, RLENGTH) + 0
        if (match(py, /[0-9]+ failed/)) f += substr(py, RSTART, RLENGTH) + 0
        if (match(py, /[0-9]+ error/)) f += substr(py, RSTART, RLENGTH) + 0
        if (match(py, /[0-9]+ skipped/)) s += substr(py, RSTART, RLENGTH) + 0
        printf "%d passed, %d failed, %d skipped\n", p, f, s
    }' "$log"
[ "$status" -eq 0 ] && [ "$pystatus" -eq 0 ]

# Sourced by the A/B cost scripts (trace-cost.sh, profile-cost.sh): servers of one model
# side by side on loopback, each waited for until ready and killed when the script exits.
# The caller sets `bin`, `out` and `imgsz`.
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT

# start_server NAME PORT [VAR=VALUE ...] [-- FLAG ...]: `serve` with those variables (and
# none of the caller's OTEL_* ones) and flags; its log in $out/NAME.log.
start_server() {
    local name="$1" p="$2" vars=()
    shift 2
    while [ $# -gt 0 ] && [ "$1" != -- ]; do
        vars+=("$1")
        shift
    done
    [ $# -gt 0 ] && shift
    env -u OTEL_EXPORTER_OTLP_ENDPOINT -u OTEL_EXPORTER_OTLP_TRACES_ENDPOINT -u OTEL_TRACES_EXPORTER "${vars[@]}" \
        "$bin" serve --host 127.0.0.1 --port "$p" --grpc-port 0 --imgsz "$imgsz" --threads 1 \
        --log-level warn "$@" 2>"$out/$name.log" &
    pids+=($!)
    for _ in $(seq 1 240); do
        curl -fs "http://127.0.0.1:$p/health/ready" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    echo "server $name did not become ready; see $out/$name.log" >&2
    exit 1
}

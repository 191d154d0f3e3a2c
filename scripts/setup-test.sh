#!/usr/bin/env bash
# What the test suite needs beyond the build (run by `make test`, after setup.sh):
# - a Python virtual environment in .cache/venv with Triton's own clients (tritonclient
#   HTTP and gRPC), pytest, Pillow and kubernetes-validate (the Kubernetes JSON schemas ship
#   in its wheel: tests/deploy needs no network), pinned in tests/triton/requirements.txt, and the
#   tracker comparison's peers (Roboflow's trackers, supervision, motmetrics), pinned
#   without dependencies in tests/video/requirements-tracking.txt, and Playwright for the
#   console's browser tests (tests/console/requirements.txt);
# - Chromium, from Debian's chromium package, the browser those tests drive (Playwright's
#   own browser downloads are never used);
# - perf_analyzer 2.60.0 (PyPI) in .cache/perf-analyzer, runnable here through a private
#   newer glibc (scripts/fetch-perf-analyzer.sh);
# - the video tests' RTSP server (GStreamer), MQTT broker (mosquitto) and H.265 test clip
#   (scripts/setup-video-peers.sh);
# - NVRTC in .cache/nvrtc (scripts/fetch-nvrtc.sh), to compile the GPU kernels in a test,
#   and a C++ compiler (g++) to run their source on the host in another;
# - promtool, from Debian's prometheus package, for the alert rules and dashboard queries in
#   deploy/ (tests/deploy/test_monitoring.py).
# Idempotent: reinstalls the environment only when the requirements change.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

venv=.cache/venv
requirements=tests/triton/requirements.txt
# The tracker comparison's pinned set, installed without dependencies (see the file).
tracking=tests/video/requirements-tracking.txt
console=tests/console/requirements.txt
stamp="$venv/.requirements.sha256"
want=$(cat "$requirements" "$tracking" "$console" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    rm -rf "$venv"
    if ! python3 -m venv "$venv" 2>/dev/null; then
        # Debian ships venv (ensurepip) separately from python3.
        echo "setup-test: installing python3-venv" >&2
        rm -rf "$venv"
        sudo_if_needed apt-get update -qq
        DEBIAN_FRONTEND=noninteractive sudo_if_needed apt-get install -y -qq python3-venv >/dev/null
        python3 -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$tracking"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$console"
    echo "$want" >"$stamp"
fi

# NVRTC, for the backend's test that compiles the GPU kernels without a GPU; a C++ compiler
# for the test that runs the same kernels' source on the host.
PYTHON="$venv/bin/python" scripts/fetch-nvrtc.sh .cache/nvrtc
if ! command -v c++ >/dev/null 2>&1; then
    echo "setup-test: installing g++ (for the GPU kernels' host test)" >&2
    sudo_if_needed apt-get update -qq
    sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null
fi

if ! command -v promtool >/dev/null 2>&1; then
    echo "setup-test: installing prometheus (for promtool)" >&2
    sudo_if_needed apt-get update -qq
    # Without recommends: promtool comes with the server alone, not its exporters.
    sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        prometheus >/dev/null
fi

if [ ! -x /usr/bin/chromium ]; then
    echo "setup-test: installing chromium (for tests/console)" >&2
    sudo_if_needed apt-get update -qq
    sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        chromium >/dev/null
fi

if ! command -v hey >/dev/null 2>&1; then
    # The load generator of the overload benchmarks (scripts/overload-defaults.sh).
    echo "setup-test: installing hey (for the overload benchmarks)" >&2
    sudo_if_needed apt-get update -qq
    sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        hey >/dev/null
fi

./scripts/fetch-perf-analyzer.sh .cache/perf-analyzer >/dev/null
./scripts/setup-video-peers.sh

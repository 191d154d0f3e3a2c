#!/usr/bin/env bash
# The video tests' real peers (run by scripts/setup-test.sh): GStreamer's RTSP server driven
# from the system Python (scripts/rtsp-test-server.py), GStreamer's plugins for mp4 parsing,
# RTP payloading, x265 and MPEG-PS muxing (mpegpsmux, in plugins-bad: the pushed-RTP test's
# camera), the mosquitto MQTT broker, and an H.265 copy of the small test clip, transcoded
# once into .cache/videos/. Installs only what is missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
shared="${PEREGRINE_SHARED:-$root/../shared}"
sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
now() { date +%s; }

packages=(
    mosquitto mosquitto-clients
    python3 python3-gi gir1.2-gst-rtsp-server-1.0 gir1.2-gstreamer-1.0
    gstreamer1.0-tools gstreamer1.0-plugins-base gstreamer1.0-plugins-good
    gstreamer1.0-plugins-bad gstreamer1.0-plugins-ugly gstreamer1.0-libav
)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    started=$(now)
    echo "setup-video-peers: installing ${missing[*]}" >&2
    sudo_if_needed apt-get update -qq
    sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
    echo "setup-video-peers: packages installed in $(( $(now) - started )) s" >&2
fi

# --- test clips ------------------------------------------------------------------------
videos="$root/.cache/videos"
h265="$videos/bikes-h265.mp4"
if [ ! -f "$h265" ]; then
    started=$(now)
    mkdir -p "$videos"
    # The small clip, re-encoded once to H.265 (fast preset, 25 fps kept, a key frame every
    # second so a client joining mid-loop starts within a second).
    gst-launch-1.0 -q filesrc location="$shared/videos/bikes.mp4" ! qtdemux ! h264parse \
        ! avdec_h264 ! videoconvert \
        ! x265enc speed-preset=ultrafast tune=zerolatency key-int-max=25 bitrate=800 \
        ! h265parse ! mp4mux ! filesink location="$h265.part"
    mv "$h265.part" "$h265"
    echo "setup-video-peers: H.265 clip transcoded in $(( $(now) - started )) s" >&2
fi

# --- check the test peers ---------------------------------------------------------------
# Elements the RTSP test server and the transcode use; a missing one names its package.
for element in appsrc qtdemux parsebin h264parse h265parse rtph264pay rtph265pay x265enc avdec_h264 mp4mux mpegpsmux; do
    gst-inspect-1.0 --exists "$element" \
        || { echo "setup-video-peers: GStreamer element $element is missing" >&2; exit 1; }
done
/usr/bin/python3 -c 'import gi; gi.require_version("GstRtspServer", "1.0"); from gi.repository import GstRtspServer' \
    || { echo "setup-video-peers: the system Python cannot load GstRtspServer (python3-gi, gir1.2-gst-rtsp-server-1.0)" >&2; exit 1; }
[ -x /usr/sbin/mosquitto ] || command -v mosquitto >/dev/null \
    || { echo "setup-video-peers: mosquitto is missing" >&2; exit 1; }

echo "setup-video-peers: ready" >&2

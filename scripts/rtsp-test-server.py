#!/usr/bin/python3
"""An RTSP server for tests: serves mp4 clips as endless live camera streams.

Each clip is parsed once at start (demuxed and parsed to Annex B access units, with the
parameter sets repeated before every key frame); every client then gets the access units
in a loop with timestamps rewritten to keep increasing, without re-encoding. GStreamer's
RTSP server payloads them (H.264 or H.265), paces them by the pipeline clock, serves TCP
and UDP clients and sends RTCP sender reports with NTP wall-clock times.

Usage: rtsp-test-server.py [--port N] MOUNT=FILE [MOUNT=FILE ...]
Prints "READY <port>" on stdout once it listens. Runs with the system Python
(/usr/bin/python3), which has the GObject bindings that scripts/setup-video.sh installs.
"""

import argparse
import os
import sys
import threading

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
gi.require_version("GstApp", "1.0")
from gi.repository import GLib, Gst, GstApp, GstRtspServer  # noqa: E402

# Start a little ahead of the clock so the first frames are not already late.
LEAD_NS = 200 * Gst.MSECOND


class Clip:
    """A clip's access units in decode order, held in memory."""

    def __init__(self, path):
        pipeline = Gst.parse_launch(
            f'filesrc location="{path}" ! qtdemux name=demux '
            "demux.video_0 ! parsebin ! appsink name=sink sync=false"
        )
        sink = pipeline.get_by_name("sink")
        self.units = []
        self.caps = None
        pipeline.set_state(Gst.State.PLAYING)
        while True:
            sample = sink.emit("pull-sample")
            if sample is None:
                break
            if self.caps is None:
                self.caps = sample.get_caps()
            buf = sample.get_buffer()
            ok, info = buf.map(Gst.MapFlags.READ)
            if not ok:
                continue
            data = bytes(info.data)
            buf.unmap(info)
            pts = buf.pts if buf.pts != Gst.CLOCK_TIME_NONE else None
            dts = buf.dts if buf.dts != Gst.CLOCK_TIME_NONE else pts
            self.units.append((data, pts, dts, buf.duration, buf.has_flags(Gst.BufferFlags.DELTA_UNIT)))
        pipeline.set_state(Gst.State.NULL)
        if not self.units:
            raise SystemExit(f"no video in {path}")
        structure = self.caps.get_structure(0).get_name()
        self.encoding = "h265" if structure == "video/x-h265" else "h264"
        frame = self.units[0][3] if self.units[0][3] != Gst.CLOCK_TIME_NONE else 40 * Gst.MSECOND
        self.duration = max((p or 0) for _, p, _, _, _ in self.units) + frame
        # parsebin's caps may say avc/hvc1; the appsrc below re-parses to byte-stream.


class LoopingFactory(GstRtspServer.RTSPMediaFactory):
    def __init__(self, clip):
        super().__init__()
        self.clip = clip
        parse = "h265parse" if clip.encoding == "h265" else "h264parse"
        pay = "rtph265pay" if clip.encoding == "h265" else "rtph264pay"
        caps = "video/x-h265" if clip.encoding == "h265" else "video/x-h264"
        self.launch = (
            "( appsrc name=src is-live=true format=time block=true max-bytes=4000000 "
            f"! {parse} config-interval=-1 ! {caps},stream-format=byte-stream,alignment=au "
            f"! {pay} name=pay0 pt=96 config-interval=-1 )"
        )
        self.connect("media-configure", self.on_media_configure)

    def do_create_element(self, url):
        return Gst.parse_launch(self.launch)

    def on_media_configure(self, factory, media):
        src = media.get_element().get_by_name("src")
        src.set_property("caps", self.clip.caps)
        state = {"stop": False}
        media.connect("unprepared", lambda m: state.update(stop=True))
        threading.Thread(target=self.feed, args=(src, state), daemon=True).start()

    def feed(self, src, state):
        clip = self.clip
        base = None
        loop = 0
        while not state["stop"]:
            for data, pts, dts, duration, delta in clip.units:
                if base is None:
                    clock = src.get_clock()
                    while clock is None and not state["stop"]:
                        # The pipeline has no clock until it plays.
                        threading.Event().wait(0.01)
                        clock = src.get_clock()
                    if state["stop"]:
                        return
                    base = clock.get_time() - src.get_base_time() + LEAD_NS
                offset = base + loop * clip.duration
                buf = Gst.Buffer.new_wrapped(data)
                buf.pts = offset + (pts or 0)
                buf.dts = offset + (dts or 0) if dts is not None else buf.pts
                buf.duration = duration
                if delta:
                    buf.set_flags(Gst.BufferFlags.DELTA_UNIT)
                if src.emit("push-buffer", buf) != Gst.FlowReturn.OK:
                    return
            loop += 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("mounts", nargs="+", help="MOUNT=FILE")
    args = parser.parse_args()
    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    mounts = server.get_mount_points()
    for spec in args.mounts:
        mount, _, path = spec.partition("=")
        if not path or not os.path.exists(path):
            raise SystemExit(f"bad mount {spec!r}: expected MOUNT=EXISTING_FILE")
        factory = LoopingFactory(Clip(path))
        # One pipeline per client, so every client starts at a key frame.
        factory.set_shared(False)
        mounts.add_factory("/" + mount.strip("/"), factory)
    if server.attach(None) == 0:
        raise SystemExit(f"cannot listen on port {args.port}")
    print(f"READY {server.get_bound_port()}", flush=True)
    GLib.MainLoop().run()


if __name__ == "__main__":
    main()

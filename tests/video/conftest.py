"""Real peers for the server's video tests: GStreamer's RTSP server
(scripts/rtsp-test-server.py, system Python), a mosquitto broker, and `peregrine serve`
itself with streams in its config file. Each listens on a free port and is stopped after
the session."""

import os
import pathlib
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHARED = pathlib.Path(os.environ.get("PEREGRINE_SHARED", ROOT.parent / "shared"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, what, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"{what} did not listen on {port}")


class Peers:
    pass


@pytest.fixture(scope="session")
def peers():
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="peregrine-video-"))
    p = Peers()
    # The RTSP server: an H.264 clip and the H.265 one setup makes, looped as live cameras.
    h265 = ROOT / ".cache" / "videos" / "bikes-h265.mp4"
    assert h265.exists(), "run scripts/setup-test.sh (it transcodes the H.265 clip)"
    rtsp = subprocess.Popen(
        ["/usr/bin/python3", str(ROOT / "scripts" / "rtsp-test-server.py"), "--port", "0",
         f"cam={SHARED / 'videos' / 'bikes.mp4'}", f"cam265={h265}"],
        stdout=subprocess.PIPE, text=True)
    line = rtsp.stdout.readline()
    assert line.startswith("READY "), line
    p.rtsp = f"rtsp://127.0.0.1:{int(line.split()[1])}"
    threading.Thread(target=lambda: [None for _ in rtsp.stdout], daemon=True).start()
    # The MQTT broker.
    p.mqtt_port = free_port()
    conf = tmp / "mosquitto.conf"
    conf.write_text(f"listener {p.mqtt_port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
    broker = subprocess.Popen([shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(conf)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(p.mqtt_port, "mosquitto")
    # A subscriber that records every message from the start. With -d it also reports its
    # SUBACK, which is waited for: from then on nothing the server publishes is missed.
    p.mqtt_lines = []
    subscribed = threading.Event()
    # stdbuf: line-buffered output through the pipe, so the SUBACK line is not held back.
    sub = subprocess.Popen(["stdbuf", "-oL", "mosquitto_sub", "-h", "127.0.0.1", "-p", str(p.mqtt_port), "-t", "peregrine/#", "-v",
                            "-d"], stdout=subprocess.PIPE, text=True, errors="replace")

    def read_sub():
        for line in sub.stdout:
            line = line.rstrip("\n")
            if line.startswith("peregrine/"):
                p.mqtt_lines.append(line)
            elif "received SUBACK" in line:
                subscribed.set()

    threading.Thread(target=read_sub, daemon=True).start()
    assert subscribed.wait(20), "mosquitto_sub did not subscribe"
    # The server, with one stream from its config file.
    config = tmp / "serve.toml"
    config.write_text(f"""
imgsz = [320, 320]
max_batch = 4
max_queue_delay_us = 5000

[[streams]]
name = "cam1"
url = "{p.rtsp}/cam"
transport = "tcp"
fps = 5

[[streams.analytics.zones]]
name = "left"
units = "normalized"
points = [[0.0, 0.0], [0.5, 0.0], [0.5, 1.0], [0.0, 1.0]]

[[streams.analytics.lines]]
name = "middle"
units = "normalized"
start = [0.5, 0.0]
end = [0.5, 1.0]

[events]
db = "{tmp / 'events.sqlite3'}"
snapshots_dir = "{tmp / 'snapshots'}"

[mqtt]
host = "127.0.0.1"
port = {p.mqtt_port}
""")
    binary = os.environ.get("PEREGRINE_BIN", str(ROOT / "target" / "debug" / "peregrine"))
    server = subprocess.Popen(
        [binary, "serve", "--config", str(config), "--host", "127.0.0.1", "--port", "0", "--grpc-port", "0",
         "--threads", "1", "--log-format", "text",
         # The RTSP test server listens on loopback, which the stream policy refuses unless
         # allowed.
         "--stream-allow-hosts", "127.0.0.1"],
        stderr=subprocess.PIPE, text=True)
    found = threading.Event()

    def read_stderr():
        for line in server.stderr:
            m = re.match(r"peregrine: listening on (http://\S+)", line)
            if m:
                p.base = m.group(1)
                found.set()

    threading.Thread(target=read_stderr, daemon=True).start()
    assert found.wait(60), "the server did not report its address"
    deadline = time.time() + 120
    while True:
        try:
            if urllib.request.urlopen(p.base + "/health/ready", timeout=2).status == 200:
                break
        except OSError:
            pass
        assert server.poll() is None, "the server exited"
        assert time.time() < deadline, "the server did not become ready"
        time.sleep(0.1)
    p.server = server
    p.tmp = tmp
    p.binary = binary
    yield p
    server.terminate()
    server.wait(30)
    for proc in (sub, broker, rtsp):
        proc.kill()
        proc.wait()
    shutil.rmtree(tmp, ignore_errors=True)

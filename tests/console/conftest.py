"""The console's peers: GStreamer's RTSP server (scripts/rtsp-test-server.py, as in
tests/video) looping the shared bikes clip as a live camera, one `peregrine serve` with API
keys, a model repository, the event store and that camera as stream cam1, and Debian's
Chromium driven by Playwright. One server and one browser for the whole session; each test
gets a fresh browser context (so a fresh sessionStorage) and fails on any console error
it did not expect. Screenshots go to target/console-screenshots/."""

import json
import os
import pathlib
import queue
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest
from playwright.sync_api import sync_playwright

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHARED = pathlib.Path(os.environ.get("PEREGRINE_SHARED", ROOT.parent / "shared"))
BINARY = os.environ.get("PEREGRINE_BIN", str(ROOT / "target" / "debug" / "peregrine"))
CHROMIUM = os.environ.get("PEREGRINE_CHROMIUM", "/usr/bin/chromium")
SHOTS = ROOT / "target" / "console-screenshots"


class Server:
    def __init__(self, base, key, rtsp, log):
        self.base, self.key, self.rtsp, self.log = base, key, rtsp, log

    def request(self, path, data=None, method=None, content_type=None):
        """The API as a client calls it, with the key; returns (status, bytes)."""
        headers = {"Authorization": f"Bearer {self.key}"}
        if content_type:
            headers["Content-Type"] = content_type
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def json(self, path, **kw):
        status, body = self.request(path, **kw)
        assert status < 300, (path, status, body)
        return json.loads(body)


def poll(check, timeout, what):
    """Polls a condition the server reaches on its own (start-up, a first frame)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting: {what}"
        time.sleep(0.1)


def rtsp_camera(tmp):
    proc = subprocess.Popen(
        ["/usr/bin/python3", str(ROOT / "scripts" / "rtsp-test-server.py"), "--port", "0",
         f"cam={SHARED / 'videos' / 'bikes.mp4'}"],
        stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("READY "), line
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    return proc, f"rtsp://127.0.0.1:{int(line.split()[1])}"


def keys_and_repository(tmp):
    out = subprocess.run([BINARY, "keys", "new", "--id", "console", "--scopes", "infer,streams,admin"],
                         check=True, capture_output=True, text=True).stdout
    key, entry = out.split("\n", 1)
    (tmp / "keys.toml").write_text(entry.strip() + "\n")
    version = tmp / "repo" / "yolo11n" / "1"
    version.mkdir(parents=True)
    shutil.copy(ROOT / "models" / "yolo11n.onnx", version / "model.onnx")
    return key


@pytest.fixture(scope="session")
def server():
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="peregrine-console-"))
    rtsp, rtsp_url = rtsp_camera(tmp)
    key = keys_and_repository(tmp)
    (tmp / "serve.toml").write_text(f"""
imgsz = [320, 320]
max_batch = 2

[[streams]]
name = "cam1"
url = "{rtsp_url}/cam"
transport = "tcp"
fps = 3

[events]
db = "{tmp / 'events.sqlite3'}"
snapshots_dir = "{tmp / 'snapshots'}"
""")
    proc = subprocess.Popen(
        [BINARY, "serve", "--config", str(tmp / "serve.toml"), "--host", "127.0.0.1", "--port", "0",
         "--grpc-port", "0", "--threads", "1", "--log-format", "text",
         "--model-repository", str(tmp / "repo"), "--api-keys-file", str(tmp / "keys.toml"),
         "--stream-allow-hosts", "127.0.0.1"],
        stderr=subprocess.PIPE, text=True)
    log, found = [], queue.Queue()

    def read_stderr():
        for line in proc.stderr:
            log.append(line)
            m = re.match(r"peregrine: listening on (http://\S+)", line)
            if m:
                found.put(m.group(1))

    threading.Thread(target=read_stderr, daemon=True).start()
    s = Server(found.get(timeout=60), key, rtsp_url, log)
    poll(lambda: proc.poll() is not None or s.request("/health/ready")[0] == 200, 120, "readiness")
    assert proc.poll() is None, "the server exited: " + "".join(log[-5:])
    poll(lambda: s.request("/v1/streams/cam1/latest.jpg")[0] == 200, 60, "cam1's first frame")
    yield s
    proc.terminate()
    proc.wait(30)
    rtsp.kill()
    rtsp.wait()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def browser():
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        yield b
        b.close()


class Console:
    """A page of the console with the key entered, and its console errors."""

    def __init__(self, page, server):
        self.page, self.server = page, server
        self.errors = []
        page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))

    def open(self, fragment=""):
        """The page at `fragment` with the key already in sessionStorage, as the key form
        leaves it (test_the_console_loads_without_a_key_and_asks_for_one uses the form)."""
        self.page.add_init_script(f"sessionStorage.setItem('peregrine.apiKey', {json.dumps(self.server.key)})")
        self.page.goto(f"{self.server.base}/ui#{fragment}")
        return self.page

    def screenshot(self, name):
        self.page.screenshot(path=str(SHOTS / f"{name}.png"))


@pytest.fixture
def console(browser, server, request):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    c = Console(context.new_page(), server)
    c.page.set_default_timeout(20_000)
    c.expected_errors = []
    yield c
    context.close()
    unexpected = [e for e in c.errors if not any(x in e for x in c.expected_errors)]
    assert not unexpected, f"console errors in {request.node.name}: {unexpected}"

"""Starts the real `peregrine serve` over a temporary model repository, once per session,
for the tritonclient suite. The binary is $PEREGRINE_BIN (default: the debug build that
`cargo test` leaves in target/debug)."""

import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import threading
import time

import pytest
import tritonclient.http as httpclient

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHARED = pathlib.Path(os.environ.get("PEREGRINE_SHARED", ROOT.parent / "shared"))
MODEL = ROOT / "models" / "yolo11n.onnx"


def _link_or_copy(src, dst):
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy(src, dst)


class Server:
    def __init__(self, proc, http, grpc, repo):
        self.proc, self.http, self.grpc, self.repo = proc, http, grpc, repo


BINARY = os.environ.get("PEREGRINE_BIN", str(ROOT / "target" / "debug" / "peregrine"))


def launch(args):
    """Starts `peregrine serve` with `args` on free ports; returns the process and its HTTP
    and gRPC addresses once it listens (not once it is ready)."""
    proc = subprocess.Popen(
        [BINARY, "serve", "--host", "127.0.0.1", "--port", "0", "--grpc-port", "0",
         "--threads", "1", "--log-format", "text", "--events-db", "none", *args],
        stderr=subprocess.PIPE, text=True)
    addresses = {}
    found = threading.Event()

    def read_stderr():
        # Keeps draining so the server never blocks on a full pipe.
        for line in proc.stderr:
            m = re.match(r"peregrine: listening on http://(\S+)", line)
            if m:
                addresses["http"] = m.group(1)
            m = re.match(r"peregrine: gRPC listening on (\S+)", line)
            if m:
                addresses["grpc"] = m.group(1)
            if len(addresses) == 2:
                found.set()

    threading.Thread(target=read_stderr, daemon=True).start()
    assert found.wait(60), "the server did not report its addresses"
    return proc, addresses["http"], addresses["grpc"]


@pytest.fixture
def launch_server():
    """`launch` for tests that start a server of their own (a fixture, because the
    `conftest` module name is shared with tests/video in one pytest run)."""
    return launch


@pytest.fixture(scope="session")
def server():
    repo = pathlib.Path(tempfile.mkdtemp(prefix="peregrine-triton-"))
    # yolo11n at 640 (the reference's size), and a small model loaded only on request.
    _link_or_copy(MODEL, repo / "yolo11n" / "1" / "model.onnx")
    (repo / "yolo11n" / "config.toml").write_text("max_batch = 4\nmax_queue_delay_us = 2000\n")
    _link_or_copy(MODEL, repo / "spare" / "1" / "model.onnx")
    (repo / "spare" / "config.toml").write_text("imgsz = [320, 320]\nmax_batch = 1\n")
    proc, http, grpc = launch(["--model-repository", str(repo), "--load-model", "yolo11n"])
    client = httpclient.InferenceServerClient(http)
    deadline = time.time() + 180
    while not client.is_server_ready():
        assert proc.poll() is None, "the server exited"
        assert time.time() < deadline, "the server did not become ready"
        time.sleep(0.1)
    yield Server(proc, http, grpc, repo)
    proc.terminate()
    proc.wait(30)
    shutil.rmtree(repo, ignore_errors=True)

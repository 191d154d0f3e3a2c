"""One `peregrine serve` with an API keys file for the security suite: keys made by
`peregrine keys new`, the embedded model. The binary is $PEREGRINE_BIN (default: the debug
build that `cargo test` leaves in target/debug)."""

import os
import pathlib
import queue
import re
import shutil
import subprocess
import tempfile
import threading

import pytest
import tritonclient.http as httpclient

from security_helpers import MAX_BODY, poll_until

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHARED = pathlib.Path(os.environ.get("PEREGRINE_SHARED", ROOT.parent / "shared"))
BINARY = os.environ.get("PEREGRINE_BIN", str(ROOT / "target" / "debug" / "peregrine"))
ADDRESS = re.compile(r"peregrine: (?:gRPC )?listening on (?:http://)?(\S+)")


def new_key(key_id, scopes):
    """A fresh key and its keys-file entry, as an operator makes them."""
    out = subprocess.run([BINARY, "keys", "new", "--id", key_id, "--scopes", scopes],
                         check=True, capture_output=True, text=True).stdout
    key, entry = out.split("\n", 1)
    return key, entry.strip() + "\n"


def repository(folder):
    """A model repository holding yolo11n (hard-linked from models/) and a secret file
    beside it that no model name may reach."""
    repo = folder / "repo"
    (repo / "yolo11n" / "1").mkdir(parents=True)
    try:
        os.link(ROOT / "models" / "yolo11n.onnx", repo / "yolo11n" / "1" / "model.onnx")
    except OSError:  # another file system
        shutil.copy(ROOT / "models" / "yolo11n.onnx", repo / "yolo11n" / "1" / "model.onnx")
    (folder / "secret.onnx").write_text("not a model")
    return repo


class KeyedServer:
    def __init__(self, proc, http, grpc, keys, log):
        self.proc, self.http, self.grpc, self.keys, self.log = proc, http, grpc, keys, log


@pytest.fixture(scope="session")
def bus_jpeg():
    return (SHARED / "images" / "bus.jpg").read_bytes()


@pytest.fixture(scope="session")
def keyed_server():
    folder = pathlib.Path(tempfile.mkdtemp(prefix="peregrine-security-"))
    keys, entries = {}, []
    for key_id, scopes in [("reader", "infer"), ("ops", "admin,infer"), ("cams", "streams")]:
        keys[key_id], entry = new_key(key_id, scopes)
        entries.append(entry)
    (folder / "keys.toml").write_text("\n".join(entries))
    proc = subprocess.Popen(
        [BINARY, "serve", "--host", "127.0.0.1", "--port", "0", "--grpc-port", "0",
         "--threads", "1", "--log-format", "text", "--events-db", "none",
         "--api-keys-file", str(folder / "keys.toml"),
         # A repository, so that model names reach the file system (path traversal), and
         # limits small enough for the attacks to hit them quickly.
         "--model-repository", str(repository(folder)), "--max-body-bytes", str(MAX_BODY),
         "--body-timeout-ms", "1000", "--stream-file-roots", str(SHARED / "videos")],
        stderr=subprocess.PIPE, text=True)
    log, addresses = [], queue.Queue()

    def read_stderr():
        # Keeps draining so the server never blocks on a full pipe; the log is kept for
        # the tests to search.
        for line in proc.stderr:
            log.append(line)
            m = ADDRESS.match(line)
            if m:
                addresses.put(m.group(1))

    threading.Thread(target=read_stderr, daemon=True).start()
    http, grpc = addresses.get(timeout=60), addresses.get(timeout=60)
    # Health is open without a key (the default): probes need none.
    ready = httpclient.InferenceServerClient(http).is_server_ready
    poll_until(lambda: ready() or proc.poll() is not None, 180, "the server became ready")
    assert proc.poll() is None, "the server exited: " + "".join(log[-5:])
    yield KeyedServer(proc, http, grpc, keys, log)
    proc.terminate()
    proc.wait(30)
    shutil.rmtree(folder, ignore_errors=True)

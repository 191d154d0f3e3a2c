"""Starts `peregrine serve` for the stream benchmark scripts (bench-video.py,
stream-churn.py): on a free loopback port, gRPC off, file streams allowed under the clip's
folder, and waits until it is ready. Standard library only."""

import os
import re
import subprocess
import sys
import threading
import time
import urllib.request


def start(binary, clip, serve_args, ready_timeout=300):
    """Returns (process, base URL) once /health/ready answers 200; exits if it never does."""
    # File streams are refused unless their folder is a file root.
    roots = os.path.dirname(os.path.abspath(clip))
    proc = subprocess.Popen([binary, "serve", "--host", "127.0.0.1", "--port", "0", "--allow-grpc", "false",
                             "--log-level", "warn", "--stream-file-roots", roots, *serve_args],
                            stderr=subprocess.PIPE, text=True, errors="replace")
    # (errors="replace": a stray byte in the log must not kill the thread draining it, or
    # the server blocks on a full pipe and the figures measure that instead.)
    base = None
    for line in proc.stderr:
        m = re.match(r"peregrine: listening on (http://\S+)", line)
        if m:
            base = m.group(1)
            break
    if base is None:
        sys.exit("the server did not start")
    # Keep reading its log so that it never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    deadline = time.time() + ready_timeout
    while True:
        try:
            if urllib.request.urlopen(base + "/health/ready", timeout=2).status == 200:
                return proc, base
        except OSError:
            pass
        if time.time() > deadline or proc.poll() is not None:
            sys.exit("the server did not become ready")
        time.sleep(0.2)

"""perf_analyzer 2.60.0 (Triton's load generator, from PyPI) against Peregrine with its
default settings, over HTTP and gRPC: it must read the metadata, configuration and
statistics it needs and finish a measurement."""

import base64
import json
import re
import struct
import subprocess

import pytest

from conftest import ROOT, SHARED

PERF_ANALYZER = ROOT / ".cache" / "perf-analyzer" / "perf_analyzer"


def run(args):
    assert PERF_ANALYZER.exists(), "perf_analyzer is missing: run scripts/setup-test.sh"
    # Short windows keep the run brief on a CPU; the rest is perf_analyzer's defaults.
    # A noisy shared CPU varies more than perf_analyzer's default 10% stability criterion.
    out = subprocess.run([str(PERF_ANALYZER), *args, "--measurement-interval", "2000",
                          "--stability-percentage", "100"],
                         capture_output=True, text=True, timeout=300)
    report = out.stdout + out.stderr
    assert out.returncode == 0, report
    return report


def throughput(report):
    m = re.search(r"Concurrency: 1, throughput: ([0-9.]+) infer/sec", report)
    assert m, report
    return float(m.group(1))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_measures_the_tensor_model_with_default_settings(server, protocol):
    url = server.http if protocol == "http" else server.grpc
    report = run(["-m", "yolo11n_tensor", "-u", url, "-i", protocol])
    assert throughput(report) > 0
    # Server-side statistics were read and counted the requests.
    m = re.search(r"Server: \s*Inference count: (\d+)", report)
    assert m and int(m.group(1)) > 0, report


def test_perf_analyzer_sends_jpegs_to_the_detection_model(server, tmp_path):
    jpeg = (SHARED / "images" / "bus.jpg").read_bytes()
    # A BYTES tensor given as b64 is sent as is, so it carries its own length prefix.
    tensor = struct.pack("<I", len(jpeg)) + jpeg
    data = tmp_path / "input.json"
    data.write_text(json.dumps({"data": [{"IMAGE": {"b64": base64.b64encode(tensor).decode()}}]}))
    report = run(["-m", "yolo11n", "-u", server.http, "--input-data", str(data), "--shape", "IMAGE:1"])
    assert throughput(report) > 0

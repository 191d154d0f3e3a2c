"""HTTPS and gRPC over TLS with real clients: curl, tritonclient over HTTP (`ssl=True`) and
gRPC (root certificates), mutual TLS, and a certificate renewal that new connections see
while connections opened before it keep working. Certificates come from openssl's CLI.
Self-contained (no conftest imports: pytest shares the `conftest` module name between
test folders)."""

import http.client
import os
import pathlib
import re
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHARED = pathlib.Path(os.environ.get("PEREGRINE_SHARED", ROOT.parent / "shared"))
BINARY = os.environ.get("PEREGRINE_BIN", str(ROOT / "target" / "debug" / "peregrine"))
BUS = SHARED / "images" / "bus.jpg"


class Pki:
    """A throwaway CA in `folder` and the leaves it signs, as PEM files."""

    def __init__(self, folder):
        self.dir = pathlib.Path(folder)
        self.ca = self.dir / "ca.pem"
        self._openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                      "-keyout", self.dir / "ca.key", "-out", self.ca, "-subj", "/CN=peregrine-test-ca",
                      "-days", "2")

    def _openssl(self, *args):
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)

    def leaf(self, name, usage="serverAuth"):
        """A certificate for 127.0.0.1 named `name`: (cert path, key path)."""
        cert, key, csr, ext = (self.dir / f"{name}.{s}" for s in ("pem", "key", "csr", "ext"))
        ext.write_text(f"subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\n")
        self._openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                      "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
        self._openssl("x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.dir / "ca.key",
                      "-CAcreateserial", "-out", cert, "-days", "2", "-extfile", ext)
        return cert, key


class TlsServer:
    def __init__(self, args):
        self.proc = subprocess.Popen(
            [BINARY, "serve", "--host", "127.0.0.1", "--port", "0", "--grpc-port", "0", "--threads", "1",
             "--log-format", "text", "--events-db", "none", "--imgsz", "320", *map(str, args)],
            stderr=subprocess.PIPE, text=True)
        self.logs, found, addresses = [], threading.Event(), {}

        def read_stderr():
            for line in self.proc.stderr:
                self.logs.append(line)
                m = re.match(r"peregrine: listening on (\w+)://(\S+)", line)
                if m:
                    addresses["scheme"], addresses["http"] = m.group(1), m.group(2)
                m = re.match(r"peregrine: gRPC listening on (\S+)", line)
                if m:
                    addresses["grpc"] = m.group(1)
                if len(addresses) == 3:
                    found.set()

        threading.Thread(target=read_stderr, daemon=True).start()
        assert found.wait(60), "the server did not report its addresses:\n" + "".join(self.logs)
        self.scheme, self.http, self.grpc = addresses["scheme"], addresses["http"], addresses["grpc"]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


def wait_ready(client):
    deadline = time.time() + 120
    while True:
        try:
            if client.is_server_ready():
                return
        except Exception:  # noqa: BLE001 - not listening or not loaded yet
            pass
        assert time.time() < deadline, "the server did not become ready"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def pki():
    folder = tempfile.mkdtemp(prefix="peregrine-tls-")
    yield Pki(folder)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def tls_server(pki):
    cert, key = pki.leaf("first")
    # The server reads its own copies, which the renewal test replaces.
    live_cert, live_key = pki.dir / "live.pem", pki.dir / "live.key"
    shutil.copy(cert, live_cert)
    shutil.copy(key, live_key)
    server = TlsServer(["--tls-cert", live_cert, "--tls-key", live_key, "--tls-reload-interval-s", "0.2"])
    wait_ready(httpclient.InferenceServerClient(server.http, ssl=True, ssl_options={"ca_certs": str(pki.ca)}))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mutual_server(pki):
    cert, key = pki.leaf("mutual")
    server = TlsServer(["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", pki.ca])
    client_cert, client_key = pki.leaf("client", usage="clientAuth")
    ssl_options = {"ca_certs": str(pki.ca), "certfile": str(client_cert), "keyfile": str(client_key)}
    wait_ready(httpclient.InferenceServerClient(server.http, ssl=True, ssl_options=ssl_options))
    yield server, client_cert, client_key
    server.stop()


def curl(*args):
    return subprocess.run(["curl", "-sS", "--max-time", "30", *map(str, args)], capture_output=True, text=True)


def test_curl_detects_over_https_and_plain_http_is_refused(pki, tls_server):
    assert tls_server.scheme == "https"
    url = f"https://{tls_server.http}/v1/detect"
    out = curl("--fail", "--cacert", pki.ca, "--data-binary", f"@{BUS}", "-H", "content-type: image/jpeg", url)
    assert out.returncode == 0, out.stderr
    assert '"detections"' in out.stdout and '"person"' in out.stdout, out.stdout
    # Without the CA, curl's verification fails: the server presents the certificate given.
    assert curl("--fail", url).returncode == 60
    # Plain HTTP to the TLS port gets no HTTP answer.
    plain = curl("--fail", f"http://{tls_server.http}/health/live")
    assert plain.returncode != 0


def test_tritonclient_over_https_and_grpc_with_root_certificates(pki, tls_server):
    http = httpclient.InferenceServerClient(tls_server.http, ssl=True, ssl_options={"ca_certs": str(pki.ca)})
    assert http.is_model_ready("yolo11n")
    assert http.get_model_metadata("yolo11n")["name"] == "yolo11n"
    grpc = grpcclient.InferenceServerClient(tls_server.grpc, ssl=True, root_certificates=str(pki.ca))
    assert grpc.is_server_ready()
    assert grpc.get_model_metadata("yolo11n").name == "yolo11n"
    # Over plaintext gRPC the TLS port answers nothing a gRPC client accepts.
    plain = grpcclient.InferenceServerClient(tls_server.grpc)
    with pytest.raises(Exception):
        plain.is_server_ready(client_timeout=5)


def peer_name(address, context):
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            subject = dict(x[0] for x in tls.getpeercert()["subject"])
            return subject["commonName"]


def test_a_renewed_certificate_is_served_without_dropping_open_connections(pki, tls_server):
    context = ssl.create_default_context(cafile=str(pki.ca))
    host, port = tls_server.http.rsplit(":", 1)
    kept = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
    kept.request("GET", "/health/live")
    assert kept.getresponse().read() is not None
    assert peer_name(tls_server.http, context) == "first"

    cert, key = pki.leaf("second")
    # Key first, then the certificate: until both are in place the pair does not match and
    # the server keeps the old one (and says so), as with a renewal written file by file.
    shutil.copy(key, pki.dir / "live.key")
    shutil.copy(cert, pki.dir / "live.pem")
    deadline = time.time() + 30
    while peer_name(tls_server.http, context) != "second":
        assert time.time() < deadline, "the renewed certificate was never served"
        time.sleep(0.1)
    # The connection opened before the renewal is still served.
    kept.request("GET", "/health/live")
    response = kept.getresponse()
    assert response.status == 200, response.read()
    kept.close()
    # The gRPC listener follows the same files.
    grpc = grpcclient.InferenceServerClient(tls_server.grpc, ssl=True, root_certificates=str(pki.ca))
    assert grpc.is_server_ready()


def test_mutual_tls_lets_in_only_clients_with_a_certificate_from_the_client_ca(pki, mutual_server):
    server, client_cert, client_key = mutual_server
    url = f"https://{server.http}/health/ready"
    assert curl("--fail", "--cacert", pki.ca, url).returncode != 0, "no client certificate"
    stranger = Pki(tempfile.mkdtemp(prefix="peregrine-tls-stranger-"))
    other_cert, other_key = stranger.leaf("stranger", usage="clientAuth")
    assert curl("--fail", "--cacert", pki.ca, "--cert", other_cert, "--key", other_key, url).returncode != 0
    shutil.rmtree(stranger.dir, ignore_errors=True)
    out = curl("--fail", "--cacert", pki.ca, "--cert", client_cert, "--key", client_key, url)
    assert out.returncode == 0, out.stderr
    grpc = grpcclient.InferenceServerClient(
        server.grpc, ssl=True, root_certificates=str(pki.ca),
        private_key=str(client_key), certificate_chain=str(client_cert))
    assert grpc.is_server_ready()
    anonymous = grpcclient.InferenceServerClient(server.grpc, ssl=True, root_certificates=str(pki.ca))
    with pytest.raises(Exception):
        anonymous.is_server_ready(client_timeout=5)

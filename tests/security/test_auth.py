"""API keys as Triton's clients meet them, over HTTP and gRPC: no key is refused, a key
with the `infer` scope runs inference (as `Authorization: Bearer` or `x-api-key`), and the
same key cannot unload a model. One server for the file (conftest.py)."""

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

PROTOCOLS = {"http": httpclient, "grpc": grpcclient}


def client(server, protocol):
    module = PROTOCOLS[protocol]
    url = server.http if protocol == "http" else server.grpc
    return module, module.InferenceServerClient(url)


def bus(module, image):
    inp = module.InferInput("IMAGE", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[image]], dtype=object))
    return [inp]


def refusal(call):
    with pytest.raises(InferenceServerException) as e:
        call()
    return f"{e.value.status()} {e.value.message()}"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_no_key_or_a_wrong_key_is_refused(keyed_server, bus_jpeg, protocol):
    module, c = client(keyed_server, protocol)
    missing = refusal(lambda: c.infer("yolo11n", bus(module, bus_jpeg)))
    assert "401" in missing or "UNAUTHENTICATED" in missing, missing
    assert "API key is required" in missing, missing
    wrong = refusal(lambda: c.get_model_metadata("yolo11n", headers={"authorization": "Bearer pk_wrong"}))
    assert "401" in wrong or "UNAUTHENTICATED" in wrong, wrong


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("form", ["bearer", "x-api-key"])
def test_an_infer_key_runs_inference(keyed_server, bus_jpeg, protocol, form):
    module, c = client(keyed_server, protocol)
    key = keyed_server.keys["reader"]
    headers = {"authorization": f"Bearer {key}"} if form == "bearer" else {"x-api-key": key}
    result = c.infer("yolo11n", bus(module, bus_jpeg), headers=headers)
    labels = [label.decode() for label in result.as_numpy("LABELS")[0]]
    assert int(result.as_numpy("NUM_DETECTIONS")[0][0]) >= 4 and "bus" in labels, labels
    assert c.get_model_metadata("yolo11n", headers=headers) is not None


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_infer_key_cannot_unload_and_no_key_reaches_the_log(keyed_server, protocol):
    module, c = client(keyed_server, protocol)
    headers = {"authorization": f"Bearer {keyed_server.keys['reader']}"}
    refused = refusal(lambda: c.unload_model("yolo11n", headers=headers))
    assert "403" in refused or "PERMISSION_DENIED" in refused, refused
    assert '"admin"' in refused, refused
    assert c.is_model_ready("yolo11n", headers=headers), "the model is still served"
    log = "".join(keyed_server.log)
    assert "refused" in log
    for key in [*keyed_server.keys.values(), "pk_wrong"]:
        assert key not in log

"""Triton's own Python clients (tritonclient.http and tritonclient.grpc) against
Peregrine: health, metadata, configuration, JPEG detection checked against Ultralytics'
reference detections, raw tensors, errors, statistics, the model repository, streaming."""

import importlib.util
import io
import json
import pathlib
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from PIL import Image
from tritonclient.utils import InferenceServerException

from conftest import SHARED

PROTOCOLS = ["http", "grpc"]


def client_for(server, protocol):
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.http)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc)


def image_input(module, images):
    inp = module.InferInput("IMAGE", [len(images), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[b] for b in images], dtype=object))
    return inp


def reference():
    with open(SHARED / "reference" / "yolo11n.json") as f:
        return json.load(f)["images"]


# The matching rule of scripts/compare-detections.py (a file name Python cannot import).
_spec = importlib.util.spec_from_file_location(
    "compare_detections", pathlib.Path(__file__).resolve().parents[2] / "scripts" / "compare-detections.py")
compare_detections = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare_detections)
iou = compare_detections.iou


def matched(ours, theirs):
    """Greedy one-to-one matching: same class, IoU >= 0.9, scores within 0.02."""
    return compare_detections.matched(ours, theirs, 0.9, 0.02)


def detections(result, i):
    n = int(result.as_numpy("NUM_DETECTIONS")[i][0])
    boxes, scores = result.as_numpy("BOXES")[i], result.as_numpy("SCORES")[i]
    classes, labels = result.as_numpy("CLASSES")[i], result.as_numpy("LABELS")[i]
    return [{"class_id": int(classes[k]), "label": labels[k].decode(), "score": float(scores[k]),
             "box": [float(v) for v in boxes[k]]} for k in range(n)]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_health_metadata_and_configuration(server, protocol):
    module, c = client_for(server, protocol)
    assert c.is_server_live() and c.is_server_ready()
    assert c.is_model_ready("yolo11n") and c.is_model_ready("yolo11n_tensor")
    assert not c.is_model_ready("no_such_model")
    meta = c.get_model_metadata("yolo11n", as_json=True) if protocol == "grpc" else c.get_model_metadata("yolo11n")
    assert meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "IMAGE", "datatype": "BYTES", "shape": ["-1", "1"] if protocol == "grpc" else [-1, 1]}]
    assert [o["name"] for o in meta["outputs"]] == ["NUM_DETECTIONS", "BOXES", "SCORES", "CLASSES", "LABELS"]
    raw = c.get_model_metadata("yolo11n_tensor", as_json=True) if protocol == "grpc" else c.get_model_metadata("yolo11n_tensor")
    assert [int(d) for d in raw["inputs"][0]["shape"]] == [-1, 3, 640, 640]
    assert [int(d) for d in raw["outputs"][0]["shape"]] == [-1, 84, 8400]
    config = c.get_model_config("yolo11n", as_json=True)["config"] if protocol == "grpc" else c.get_model_config("yolo11n")
    assert int(config["max_batch_size"]) == 4
    assert "dynamic_batching" in config
    assert json.loads(config["parameters"]["class_names"]["string_value"])[0] == "person"
    server_meta = c.get_server_metadata(as_json=True) if protocol == "grpc" else c.get_server_metadata()
    assert "statistics" in server_meta["extensions"] and "binary_tensor_data" in server_meta["extensions"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_jpeg_detections_match_the_reference(server, protocol):
    module, c = client_for(server, protocol)
    ref = reference()
    names = [n for n in sorted(ref) if n.endswith(".jpg")]
    total_ref = total_matched = 0
    # Two images per request: the server decodes each and batches them.
    for pair in [names[i:i + 2] for i in range(0, len(names), 2)]:
        images = [(SHARED / "images" / n).read_bytes() for n in pair]
        result = c.infer("yolo11n", [image_input(module, images)])
        assert result.get_response(as_json=True)["model_version"] == "1" if protocol == "grpc" else result.get_response()["model_version"] == "1"
        for i, name in enumerate(pair):
            ours = detections(result, i)
            theirs = ref[name]["detections"]
            names = {t["class_id"]: t["class_name"] for t in theirs}
            assert all(d["label"] == names.get(d["class_id"], d["label"]) for d in ours), ours
            total_ref += len(theirs)
            total_matched += matched(ours, theirs)
            assert len(ours) == len(theirs), f"{name}: {len(ours)} detections, reference {len(theirs)}"
    assert total_matched == total_ref, f"{total_matched} of {total_ref} reference detections matched"


def nms_decode(raw, conf=0.25, iou_threshold=0.7):
    """The tensor model's raw [84, 8400] output decoded as Ultralytics does: best class per
    anchor, score above conf, class-aware NMS."""
    boxes, scores = raw[:4].T, raw[4:].T
    cls = scores.argmax(1)
    best = scores[np.arange(len(cls)), cls]
    keep = best > conf
    boxes, best, cls = boxes[keep], best[keep], cls[keep]
    xyxy = np.stack([boxes[:, 0] - boxes[:, 2] / 2, boxes[:, 1] - boxes[:, 3] / 2,
                     boxes[:, 0] + boxes[:, 2] / 2, boxes[:, 1] + boxes[:, 3] / 2], 1)
    order = best.argsort()[::-1]
    kept = []
    for i in order:
        if all(cls[i] != cls[j] or iou(xyxy[i], xyxy[j]) <= iou_threshold for j in kept):
            kept.append(i)
    return [{"class_id": int(cls[i]), "score": float(best[i]), "box": [float(v) for v in xyxy[i]]} for i in kept]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_float_tensors_give_the_raw_output_the_detection_model_decodes(server, protocol):
    module, c = client_for(server, protocol)
    # A 640x640 crop needs no resizing, so both paths see exactly the same pixels.
    crop = Image.open(SHARED / "images" / "bus.jpg").convert("RGB").crop((0, 200, 640, 840))
    pixels = np.asarray(crop)
    png = io.BytesIO()
    crop.save(png, format="PNG")
    tensor = (pixels.astype(np.float32) / 255.0).transpose(2, 0, 1)[None]
    inp = module.InferInput("images", [1, 3, 640, 640], "FP32")
    inp.set_data_from_numpy(tensor)
    raw = c.infer("yolo11n_tensor", [inp]).as_numpy("output0")
    assert raw.shape == (1, 84, 8400)
    ours = nms_decode(raw[0])
    served = detections(c.infer("yolo11n", [image_input(module, [png.getvalue()])]), 0)
    assert len(served) == len(ours) > 0
    assert matched(ours, served) == len(served)


def test_json_outputs_and_parameters(server):
    c = httpclient.InferenceServerClient(server.http)
    image = (SHARED / "images" / "bus.jpg").read_bytes()
    outputs = [httpclient.InferRequestedOutput("SCORES", binary_data=False),
               httpclient.InferRequestedOutput("LABELS", binary_data=True)]
    result = c.infer("yolo11n", [image_input(httpclient, [image])], outputs=outputs,
                     parameters={"conf": 0.5, "classes": "person"})
    response = result.get_response()
    assert [o["name"] for o in response["outputs"]] == ["SCORES", "LABELS"]
    assert "data" in response["outputs"][0]
    labels = [l.decode() for l in result.as_numpy("LABELS")[0]]
    assert labels and set(labels) == {"person"}
    assert all(s > 0.5 for s in result.as_numpy("SCORES")[0])
    one = c.infer("yolo11n", [image_input(httpclient, [image])], parameters={"max_det": 1})
    assert one.as_numpy("NUM_DETECTIONS")[0][0] == 1


def test_class_filter_by_name_over_grpc(server):
    c = grpcclient.InferenceServerClient(server.grpc)
    image = [image_input(grpcclient, [(SHARED / "images" / "bus.jpg").read_bytes()])]
    everything = detections(c.infer("yolo11n", image), 0)
    people = [d for d in everything if d["label"] == "person"]
    assert 3 <= len(people) < len(everything), everything
    filtered = detections(c.infer("yolo11n", image, parameters={"classes": "person"}), 0)
    assert [d["label"] for d in filtered] == ["person"] * len(people)
    assert matched(filtered, people) == len(people)
    both = detections(c.infer("yolo11n", image, parameters={"classes": "person,bus"}), 0)
    assert sorted(d["label"] for d in both) == sorted(
        d["label"] for d in everything if d["label"] in ("person", "bus"))
    assert "bus" in {d["label"] for d in both}
    with pytest.raises(InferenceServerException, match='unknown class "unicorn"'):
        c.infer("yolo11n", image, parameters={"classes": "unicorn"})


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_requests_are_refused_with_a_reason(server, protocol):
    module, c = client_for(server, protocol)
    with pytest.raises(InferenceServerException, match="unknown model"):
        c.infer("no_such_model", [image_input(module, [b"x"])])
    with pytest.raises(InferenceServerException, match="not an image in a supported format"):
        c.infer("yolo11n", [image_input(module, [b"not an image at all"])])
    wrong = module.InferInput("images", [1, 3, 32, 32], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 3, 32, 32), np.float32))
    with pytest.raises(InferenceServerException, match=r"this model takes \[N, 3, 640, 640\]"):
        c.infer("yolo11n_tensor", [wrong])
    too_many = module.InferInput("images", [5, 3, 640, 640], "FP32")
    too_many.set_data_from_numpy(np.zeros((5, 3, 640, 640), np.float32))
    with pytest.raises(InferenceServerException, match="over this model's max_batch_size of 4"):
        c.infer("yolo11n_tensor", [too_many])
    with pytest.raises(InferenceServerException, match="conf"):
        c.infer("yolo11n", [image_input(module, [(SHARED / "images" / "bus.jpg").read_bytes()])],
                parameters={"conf": 7})


def model_stats(module, c, protocol):
    stats = c.get_inference_statistics("yolo11n", as_json=True) if protocol == "grpc" else c.get_inference_statistics("yolo11n")
    return stats["model_stats"][0]


STAT_KEYS = ["success", "queue", "compute_input", "compute_infer", "compute_output"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_statistics_count_what_ran(server, protocol):
    module, c = client_for(server, protocol)
    before = model_stats(module, c, protocol)
    c.infer("yolo11n", [image_input(module, [(SHARED / "images" / "zidane.jpg").read_bytes()])])
    s = model_stats(module, c, protocol)
    assert s["name"] == "yolo11n" and s["version"] == "1"
    # The suite runs one test at a time, so this request alone moves the counters: one
    # image in one model run, each stage counted once. (gRPC's JSON leaves out zeros.)
    def delta(*path):
        def get(stats):
            for key in path:
                stats = stats.get(key, {})
            return int(stats or 0)
        return get(s) - get(before)
    assert delta("inference_count") == 1
    assert delta("execution_count") == 1
    for key in STAT_KEYS:
        assert delta("inference_stats", key, "count") == 1, key


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_repository_load_and_unload(server, protocol):
    module, c = client_for(server, protocol)
    index = c.get_model_repository_index(as_json=True)["models"] if protocol == "grpc" else c.get_model_repository_index()
    assert {"name": "spare"} in [{k: v for k, v in e.items() if k == "name"} for e in index]
    assert not c.is_model_ready("spare")
    c.load_model("spare")
    assert c.is_model_ready("spare")
    result = c.infer("spare", [image_input(module, [(SHARED / "images" / "bus.jpg").read_bytes()])])
    assert result.as_numpy("NUM_DETECTIONS")[0][0] > 0
    c.unload_model("spare")
    assert not c.is_model_ready("spare")
    with pytest.raises(InferenceServerException, match="not ready: unloaded"):
        c.infer("spare", [image_input(module, [(SHARED / "images" / "bus.jpg").read_bytes()])])
    with pytest.raises(InferenceServerException, match="not in the repository"):
        c.load_model("absent")


def test_grpc_streaming_answers_every_request(server):
    c = grpcclient.InferenceServerClient(server.grpc)
    answers = queue.Queue()
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    image = (SHARED / "images" / "bus.jpg").read_bytes()
    for i in range(3):
        c.async_stream_infer("yolo11n", [image_input(grpcclient, [image])], request_id=str(i))
    c.async_stream_infer("yolo11n", [image_input(grpcclient, [b"junk"])], request_id="bad")
    got = {}
    for _ in range(4):
        result, error = answers.get(timeout=120)
        if error is not None:
            got["bad"] = str(error)
        else:
            got[result.get_response().id] = int(result.as_numpy("NUM_DETECTIONS")[0][0])
    c.stop_stream()
    assert got["0"] == got["1"] == got["2"] == 5
    assert "bad" in got


def test_async_http_requests_are_batched(server):
    c = httpclient.InferenceServerClient(server.http, concurrency=4)
    runs = lambda: {int(b["batch_size"]): int(b["compute_infer"]["count"])
                    for b in c.get_inference_statistics("yolo11n")["model_stats"][0]["batch_stats"]}
    before = runs()
    image = (SHARED / "images" / "bus.jpg").read_bytes()
    pending = [c.async_infer("yolo11n", [image_input(httpclient, [image])]) for _ in range(8)]
    counts = [p.get_result().as_numpy("NUM_DETECTIONS")[0][0] for p in pending]
    assert counts == [5] * 8
    after = runs()
    # Model runs of each batch size made by these eight requests alone.
    new = {size: n - before.get(size, 0) for size, n in after.items() if n > before.get(size, 0)}
    assert sum(size * n for size, n in new.items()) == 8, new
    assert any(size > 1 for size in new), f"these requests never batched: {new}"

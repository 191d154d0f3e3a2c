"""Video analytics through the whole server, on the RTSP camera `cam1` (the bikes clip at
5 fps) with a zone over the left half and a line down the middle: track ids on
detections (checked against Roboflow's ByteTrack on the same detections), object events
stored in SQLite and queryable, snapshots, zones and lines at run time, the latest frame
and the MJPEG feed, MQTT's event topics."""

import importlib.util
import io
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import cv2
import numpy as np
import pytest
from PIL import Image

from conftest import ROOT, SHARED
from test_streams import call, sse_events


def get(url, timeout=30):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def wait_events(base, query, want=1, timeout=60):
    """Stored events matching `query`, once there are at least `want`."""
    deadline = time.time() + timeout
    while True:
        status, body = call("GET", f"{base}/v1/events?{query}")
        assert status == 200, body
        if len(body["events"]) >= want or time.time() > deadline:
            return body
        time.sleep(0.2)


def load_compare():
    spec = importlib.util.spec_from_file_location("track_compare", ROOT / "scripts" / "track-compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stream_events_from_the_start(base, definition, want, timeout=90):
    """The first `want` detection events of a stream added now: the all-streams feed is
    subscribed before the stream exists, so its first frame is seen."""
    events, kind = [], None
    deadline = time.time() + timeout
    with urllib.request.urlopen(f"{base}/v1/streams/events", timeout=timeout) as r:
        status, body = call("POST", f"{base}/v1/streams", definition)
        assert status == 201, body
        for raw in r:
            line = raw.decode().rstrip("\n")
            if line.startswith("event:"):
                kind = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and kind == "detection":
                e = json.loads(line.split(":", 1)[1])
                if e["stream"] == definition["name"]:
                    events.append(e)
                    if len(events) >= want:
                        return events
            assert time.time() < deadline, f"only {len(events)} events in {timeout} s"
    return events


@pytest.fixture(scope="module")
def tracked_stream(peers):
    """60 detection events of the bikes clip at 10 fps on a stream added for them."""
    try:
        return stream_events_from_the_start(
            peers.base, {"name": "trk", "url": f"{peers.rtsp}/cam", "fps": 10}, 60)
    finally:
        call("DELETE", f"{peers.base}/v1/streams/trk")


def test_track_ids_agree_with_roboflow_bytetrack_on_the_same_detections(tracked_stream):
    compare = load_compare()
    events = tracked_stream
    frames = [{"detections": [{"class_id": d["class_id"], "score": d["score"], "box": d["box"]}
                              for d in e["detections"]]} for e in events]
    ours = [[d.get("track_id") for d in e["detections"]] for e in events]
    assert sum(i is not None for f in ours for i in f) > 30, "the bikes clip has tracked objects"
    # The server's defaults are trackers' defaults; its lost budget (1 s) is 10 frames at
    # 10 fps, as trackers counts it.
    truth, budget = compare.trackers_ids(frames, 10.0, True, {})
    assert budget == 10
    result = compare.compare(frames, truth, ours)
    print("tracking vs trackers.ByteTrackTracker:", result)
    assert result["idf1"] >= 0.9, result


def zones_compare(*args):
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "zones-compare.py"), *map(str, args)],
                         capture_output=True, text=True, timeout=120)
    return run.returncode, run.stdout + run.stderr


@pytest.mark.parametrize("source", ["synthetic", "server tracks"])
def test_zones_and_lines_agree_with_supervision(tracked_stream, tmp_path, source):
    """crates/zones (its zones_jsonl example, which `cargo test` builds) against
    supervision's PolygonZone and LineZone, hysteresis off: the same memberships, crossings
    and counts, on random walks with jitter and on the server's own tracks of the clip."""
    example = ROOT / "target" / "debug" / "examples" / "zones_jsonl"
    assert example.exists(), "cargo test builds crates/zones' examples"
    if source == "synthetic":
        code, out = zones_compare("synth", tmp_path, "--seed", 3, "--frames", 400, "--objects", 40)
        assert code == 0, out
    else:
        (tmp_path / "definition.json").write_text(json.dumps({
            "frame": [640, 272], "anchor": "bottom_center", "hysteresis": {"frames": 1, "margin_px": 0},
            "zones": [{"name": "left", "points": [[0, 0], [0.5, 0], [0.5, 1], [0, 1]], "units": "normalized",
                       "classes": None, "loiter_s": None}],
            "lines": [{"name": "middle", "start": [320, 0], "end": [320, 272], "units": "pixels", "classes": None},
                      {"name": "low", "start": [0, 200], "end": [640, 200], "units": "pixels", "classes": None}]}))
        with open(tmp_path / "tracks.jsonl", "w") as f:
            for n, e in enumerate(tracked_stream):
                objects = [{"track_id": d["track_id"], "class_id": d["class_id"], "bbox": d["box"]}
                           for d in e["detections"] if "track_id" in d]
                f.write(json.dumps({"frame": n, "pts_ms": e["pts_seconds"] * 1000, "objects": objects}) + "\n")
    code, out = zones_compare("compare", tmp_path / "definition.json", tmp_path / "tracks.jsonl", "--bin", example)
    print(out)
    assert code == 0, out


def test_object_events_are_stored_paged_and_have_snapshots(peers):
    body = wait_events(peers.base, "stream=cam1&type=object.start&limit=2", want=2)
    first, second = body["events"]
    assert first["type"] == "object.start" and first["stream"] == "cam1" and first["track_id"] >= 1
    assert first["capture_unix_ms"] >= second["capture_unix_ms"], "newest first"
    # The next page starts after the last one of this page.
    status, page2 = call("GET", f"{peers.base}/v1/events?stream=cam1&type=object.start&limit=1&cursor="
                         + call("GET", f"{peers.base}/v1/events?stream=cam1&type=object.start&limit=1")[1]["next_cursor"])
    assert status == 200 and page2["events"][0]["id"] != first["id"] or len(body["events"]) == 1
    status, one = call("GET", f"{peers.base}/v1/events/{first['id']}")
    assert status == 200 and one == first
    status, headers, jpeg = get(f"{peers.base}{first['snapshot_url']}")
    assert status == 200 and headers["content-type"] == "image/jpeg"
    assert Image.open(io.BytesIO(jpeg)).size == (640, 272)
    # Deleted: gone, with its snapshot.
    assert call("DELETE", f"{peers.base}/v1/events/{first['id']}")[0] == 204
    assert call("GET", f"{peers.base}/v1/events/{first['id']}")[0] == 404
    assert get(f"{peers.base}{first['snapshot_url']}")[0] == 404


def iou(a, b):
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - iw * ih
    return iw * ih / union if union > 0 else 0.0


@pytest.fixture(scope="module")
def clip_frames():
    """Every frame of the clip the RTSP camera plays, as RGB arrays (OpenCV's decoder)."""
    cap = cv2.VideoCapture(str(SHARED / "videos" / "bikes.mp4"))
    frames = []
    while True:
        ok, frame = cap.read()
        if not ok:
            return frames
        frames.append(frame[:, :, ::-1].astype(np.int16))


def test_snapshots_show_the_object_of_their_event(peers, clip_frames):
    """Each snapshot is a frame of the clip (the closest one differs from it by little more
    than JPEG's loss and the drawn boxes), and on that frame, clean, the detector finds the
    event's object where the event says. (Detecting on the snapshot itself does not work:
    the drawn boxes and labels hide the objects from the model.)"""
    body = wait_events(peers.base, "stream=cam1&type=object.start&limit=100", want=5)
    confident = [e for e in body["events"] if e["score"] >= 0.5 and "snapshot_url" in e][:5]
    assert confident, body["events"]
    for event in confident:
        status, _, jpeg = get(f"{peers.base}{event['snapshot_url']}")
        assert status == 200, event
        snapshot = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"), dtype=np.int16)
        distances = [np.abs(frame - snapshot).mean() for frame in clip_frames]
        nearest = int(np.argmin(distances))
        # About 10 levels measured (2026-12-02): the drawn boxes and labels, and JPEG's loss;
        # other frames of the clip lie around 60 away.
        assert distances[nearest] < min(15, np.median(distances) / 3), (event, distances[nearest],
                                                                         np.median(distances))
        clean = cv2.imencode(".png", clip_frames[nearest][:, :, ::-1].astype(np.uint8))[1].tobytes()
        req = urllib.request.Request(f"{peers.base}/v1/detect", data=clean, method="POST",
                                     headers={"content-type": "image/png"})
        with urllib.request.urlopen(req, timeout=60) as r:
            found = json.loads(r.read())["detections"]
        best = max((iou(d["box"], event["box"]) for d in found if d["class_name"] == event["label"]),
                   default=0.0)
        assert best >= 0.5, (event, nearest, found)


@pytest.mark.parametrize("query, says", [
    ("limit=0", "limit 0"),
    ("limit=5000", "limit 5000"),
    ("type=object.wander", "object.wander"),
    ("cursor=not-a-cursor", "cursor"),
    ("after=yesterday", "after"),
    ("after=2000&before=1000", "time range"),
    ("colour=red", "colour"),
])
def test_bad_event_queries_are_400_and_say_why(peers, query, says):
    status, body = call("GET", f"{peers.base}/v1/events?{query}")
    assert status == 400, body
    assert says in body["error"]["message"], body


def test_zones_and_lines_are_reported_and_replaced_at_run_time(peers):
    status, z = call("GET", f"{peers.base}/v1/streams/cam1/zones")
    assert status == 200, z
    assert [x["name"] for x in z["zones"]] == ["left"] and [x["name"] for x in z["lines"]] == ["middle"]
    assert z["tracking"] and z["zone_error"] is None
    for bad, says in [
        ([{"name": "tri", "points": [[0, 0], [10, 0]]}], "3"),
        ([{"name": "bow", "points": [[0, 0], [100, 100], [100, 0], [0, 100]]}], "intersect"),
        ([{"name": "far", "points": [[0, 0], [5000, 0], [5000, 100]]}], "far"),
        ([{"name": "cls", "points": [[0, 0], [100, 0], [100, 100]], "classes": ["unicorn"]}], "unicorn"),
        ({"name": "not-a-list"}, "array"),
    ]:
        status, body = call("PUT", f"{peers.base}/v1/streams/cam1/zones", bad)
        assert status == 400, (bad, body)
        assert says in body["error"]["message"], (says, body)
    assert call("PUT", f"{peers.base}/v1/streams/nope/zones", [])[0] == 404
    right = [{"name": "right", "units": "normalized", "points": [[0.5, 0], [1, 0], [1, 1], [0.5, 1]],
              "classes": ["person", 1], "loiter_s": 30}]
    status, z = call("PUT", f"{peers.base}/v1/streams/cam1/zones", right)
    assert status == 200, z
    assert [x["name"] for x in z["zones"]] == ["right"] and z["lines"][0]["name"] == "middle"
    status, z = call("PUT", f"{peers.base}/v1/streams/cam1/zones",
                     [{"name": "left", "units": "normalized", "points": [[0, 0], [0.5, 0], [0.5, 1], [0, 1]]}])
    assert status == 200 and z["zones"][0]["name"] == "left"


def test_zone_and_line_events_fire_and_are_counted(peers):
    body = wait_events(peers.base, "stream=cam1&zone=left&type=zone.enter", timeout=90)
    assert body["events"], "someone walks into the left half of the bikes clip"
    e = body["events"][0]
    assert e["zone"] == "left" and e["label"] and e["track_id"] >= 1
    text = urllib.request.urlopen(f"{peers.base}/metrics", timeout=10).read().decode()
    assert 'peregrine_object_events_total{stream="cam1",type="zone.enter"}' in text
    assert "peregrine_zone_objects{" in text


def test_the_latest_frame_and_the_mjpeg_feed(peers):
    status, headers, plain = get(f"{peers.base}/v1/streams/cam1/latest.jpg")
    assert status == 200 and headers["content-type"] == "image/jpeg"
    assert Image.open(io.BytesIO(plain)).size == (640, 272)
    status, _, drawn = get(f"{peers.base}/v1/streams/cam1/latest.jpg?annotate=true")
    assert status == 200 and Image.open(io.BytesIO(drawn)).size == (640, 272)
    assert get(f"{peers.base}/v1/streams/nope/latest.jpg")[0] == 404
    assert get(f"{peers.base}/v1/streams/cam1/mjpeg?fps=100")[0] == 400
    with urllib.request.urlopen(f"{peers.base}/v1/streams/cam1/mjpeg?fps=10&annotate=true", timeout=30) as r:
        assert r.headers["content-type"].startswith("multipart/x-mixed-replace; boundary=")
        parts = 0
        while parts < 2:
            line = r.readline()
            if line.lower().startswith(b"content-length:"):
                n = int(line.split(b":")[1])
                r.readline()
                assert Image.open(io.BytesIO(r.read(n))).size == (640, 272)
                parts += 1


def test_object_events_and_snapshots_go_to_mqtt(peers):
    deadline = time.time() + 60
    while time.time() < deadline:
        if any(l.startswith("peregrine/events ") for l in peers.mqtt_lines) and \
                any(l.startswith("peregrine/cam1/") and "/snapshot " in l for l in peers.mqtt_lines):
            break
        time.sleep(0.2)
    event = json.loads(next(l.split(" ", 1)[1] for l in peers.mqtt_lines if l.startswith("peregrine/events ")))
    assert event["schema_version"] == 3 and event["type"].split(".")[0] in ("object", "zone", "line")
    assert any(l.startswith("peregrine/cam1/") and "/snapshot " in l for l in peers.mqtt_lines)


def test_stored_events_outlive_the_server(peers):
    """A second server on the same database (as after a restart) serves the same events."""
    before = wait_events(peers.base, "stream=cam1&limit=5")["events"]
    assert before
    proc = subprocess.Popen(
        [peers.binary, "serve", "--host", "127.0.0.1", "--port", "0", "--grpc-port", "0", "--threads", "1",
         "--imgsz", "320", "--events-db", str(peers.tmp / "events.sqlite3"), "--log-format", "text"],
        stderr=subprocess.PIPE, text=True)
    try:
        base = None
        for line in proc.stderr:
            if line.startswith("peregrine: listening on "):
                base = line.split()[-1]
                break
        assert base, "the second server did not listen"
        ids = {e["id"] for e in call("GET", f"{base}/v1/events?stream=cam1&limit=1000")[1]["events"]}
        assert {e["id"] for e in before} <= ids
    finally:
        proc.terminate()
        proc.wait(30)

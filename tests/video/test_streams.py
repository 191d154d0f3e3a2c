"""Video streams through the whole server: RTSP cameras (H.264 over TCP, H.265 over UDP)
decoded and detected on the server's own engine, results received over Server-Sent Events,
a WebSocket and MQTT through a real broker; streams added and removed at run time."""

import asyncio
import json
import socket
import time
import urllib.error
import urllib.request

import aiohttp


def call(method, url, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read().decode()
            return r.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode() or "null")


def sse_events(url, want, timeout=90):
    """The first `want` detection events of an SSE feed, as parsed JSON."""
    events, kind = [], None
    deadline = time.time() + timeout
    with urllib.request.urlopen(url, timeout=timeout) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for raw in r:
            line = raw.decode().rstrip("\n")
            if line.startswith("event:"):
                kind = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and kind == "detection":
                events.append(json.loads(line.split(":", 1)[1]))
                if len(events) >= want:
                    return events
            assert time.time() < deadline, f"only {len(events)} events in {timeout} s"
    return events


def test_a_configured_camera_streams_detections_over_sse(peers):
    events = sse_events(f"{peers.base}/v1/streams/cam1/events", 3)
    for e in events:
        assert e["stream"] == "cam1" and e["schema_version"] == 3
        assert (e["width"], e["height"]) == (640, 272)
        assert e["clock_source"] in ("rtcp", "local")
        assert e["latency_ms"] >= 0 and e["capture_unix_ms"] > 0
        for d in e["detections"]:
            assert 0 <= d["box"][0] <= d["box"][2] <= 640 and d["class_name"]
    assert any(e["detections"] for e in events), "the bikes clip has people and bicycles in it"
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)


def test_streams_are_added_listed_and_removed_at_run_time(peers):
    status, body = call("POST", f"{peers.base}/v1/streams",
                        {"name": "cam2", "url": f"{peers.rtsp}/cam265", "transport": "udp", "fps": 2})
    assert status == 201, body
    assert body["name"] == "cam2" and body["config"]["transport"] == "udp"
    events = [e for e in sse_events(f"{peers.base}/v1/streams/events", 12) if e["stream"] == "cam2"]
    assert events, "the H.265 camera over UDP delivers detections on the all-streams feed"
    status, listed = call("GET", f"{peers.base}/v1/streams")
    names = {s["name"]: s["status"]["state"] for s in listed["streams"]}
    assert names == {"cam1": "streaming", "cam2": "streaming"}, listed
    status, report = call("GET", f"{peers.base}/v1/streams/cam2")
    assert report["counters"]["frames_detected"] > 0 and report["counters"]["frames_decoded"] > 0
    assert call("POST", f"{peers.base}/v1/streams", {"name": "cam2", "url": f"{peers.rtsp}/cam265"})[0] == 409
    status, err = call("POST", f"{peers.base}/v1/streams", {"name": "bad", "url": "ftp://nowhere"})
    assert status == 400, err
    status, err = call("POST", f"{peers.base}/v1/streams", {"name": "x", "urll": "rtsp://h/p"})
    assert status == 400 and "unknown field" in err["error"]["message"], err
    assert call("DELETE", f"{peers.base}/v1/streams/cam2")[0] == 204
    assert call("GET", f"{peers.base}/v1/streams/cam2")[0] == 404
    assert call("DELETE", f"{peers.base}/v1/streams/cam2")[0] == 404


def test_a_stream_backing_off_is_removed_at_once(peers):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nothing = s.getsockname()[1]
    # Refused, then a backoff far longer than the test: removing must not sit it out.
    never = 600_000
    status, body = call("POST", f"{peers.base}/v1/streams", {
        "name": "refused", "url": f"rtsp://127.0.0.1:{nothing}/cam",
        "backoff": {"first_retry_ms": never, "initial_ms": never, "max_ms": never}})
    assert status == 201, body
    deadline = time.time() + 30
    while True:
        status, report = call("GET", f"{peers.base}/v1/streams/refused")
        assert status == 200, report
        if report["status"]["state"] == "backing_off":
            break
        assert time.time() < deadline, report
        time.sleep(0.05)
    assert "127.0.0.1" in report["status"]["last_error"], report
    started = time.time()
    assert call("DELETE", f"{peers.base}/v1/streams/refused")[0] == 204
    assert time.time() - started < 15, "a sanity bound: the backoff was 600 s"
    assert call("GET", f"{peers.base}/v1/streams/refused")[0] == 404
    status, listed = call("GET", f"{peers.base}/v1/streams")
    assert "refused" not in {s["name"] for s in listed["streams"]}, listed


def test_detections_arrive_over_a_websocket(peers):
    async def first():
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(f"{peers.base}/v1/streams/cam1/ws") as ws:
                msg = await asyncio.wait_for(ws.receive(), 60)
                return json.loads(msg.data)
    event = asyncio.run(first())
    assert event["stream"] == "cam1" and "detections" in event


def test_detections_and_status_go_to_mqtt(peers):
    deadline = time.time() + 60
    while time.time() < deadline:
        topics = [l.split(" ", 1)[0] for l in peers.mqtt_lines]
        if "peregrine/cam1/detections" in topics and "peregrine/cam1/status" in topics:
            break
        time.sleep(0.2)
    topics = [l.split(" ", 1)[0] for l in peers.mqtt_lines]
    assert "peregrine/cam1/detections" in topics, topics[:20]
    assert "peregrine/cam1/status" in topics
    payload = next(l.split(" ", 1)[1] for l in peers.mqtt_lines if l.startswith("peregrine/cam1/detections "))
    assert json.loads(payload)["stream"] == "cam1"


def test_stream_metrics_are_exported(peers):
    text = urllib.request.urlopen(f"{peers.base}/metrics", timeout=10).read().decode()
    assert 'peregrine_stream_frames_detected_total{stream="cam1"}' in text
    assert "peregrine_stream_glass_to_result_seconds_bucket" in text

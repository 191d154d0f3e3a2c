"""The web console in a real browser (Debian's Chromium) against the real server and a
real RTSP camera: what a user sees on each page, compared with what the API says."""

import json
import os
import pathlib
import re

from playwright.sync_api import expect

SHARED = pathlib.Path(os.environ.get("PEREGRINE_SHARED", pathlib.Path(__file__).resolve().parents[3] / "shared"))
PHOTO = SHARED / "images" / "bus.jpg"


def test_the_console_loads_without_a_key_and_asks_for_one(console, server):
    # The page and its scripts are open; the API behind them is not.
    page = console.page
    page.goto(server.base + "/")
    expect(page).to_have_url(re.compile(r"/ui(#.*)?$"))
    console.expected_errors = ["status of 401"]
    expect(page.locator("main .error").first).to_contain_text("enter an API key")
    page.get_by_label("API key").fill(server.key)
    page.get_by_role("button", name="Use key").click()
    expect(page.locator("article[data-stream=cam1]")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('peregrine.apiKey')") == server.key


def test_live_draws_the_boxes_of_each_frame_on_its_picture(console, server):
    page = console.open("/live")
    tile = page.locator("article[data-stream=cam1]")
    canvas = tile.locator("canvas")
    expect(canvas).to_have_attribute("data-boxes", re.compile(r"^[1-9]"), timeout=30_000)
    expect(tile.locator(".badge")).to_have_text("streaming")
    expect(tile.locator(".stats")).to_contain_text(re.compile(r"[0-9.]+ fps"))
    # The canvas holds the picture at the frame's own size.
    status = server.json("/v1/streams/cam1")
    assert status["status"]["state"] == "streaming"
    width, height = canvas.evaluate("c => [c.width, c.height]")
    assert width > 300 and height > 150, (width, height)
    console.screenshot("live")


def test_the_large_view_shows_zones_lines_and_recent_events(console, server):
    server.json("/v1/streams/cam1/zones", method="PUT", content_type="application/json",
                data=json.dumps([{"name": "left", "units": "normalized",
                                  "points": [[0, 0], [0.5, 0], [0.5, 1], [0, 1]]}]).encode())
    page = console.open("/live/cam1")
    expect(page.get_by_role("heading", name="cam1")).to_be_visible()
    expect(page.locator("section[data-stream=cam1] canvas")).to_have_attribute(
        "data-boxes", re.compile(r"^[0-9]"), timeout=30_000)
    expect(page.get_by_role("list", name="Recent events").locator("li").first).to_be_visible(timeout=30_000)
    console.screenshot("live-stream")


def test_adding_a_stream_through_the_form_shows_it_and_server_errors(console, server):
    page = console.open("/streams")
    form = page.get_by_role("form", name="Add a stream")
    form.get_by_label("Name").fill("bad")
    form.get_by_label("URL").fill("gopher://nowhere/x")
    console.expected_errors = ["status of 400", "status of 403", "status of 422"]
    form.get_by_role("button", name="Add stream").click()
    expect(form.get_by_role("alert")).to_contain_text("url must start with rtsp://")
    form.get_by_label("Name").fill("cam2")
    form.get_by_label("URL").fill(f"{server.rtsp}/cam")
    form.get_by_label("Frames per second").fill("1")
    form.get_by_role("button", name="Add stream").click()
    row = page.locator("tr[data-stream=cam2]")
    expect(row).to_be_visible()
    expect(form.get_by_role("alert")).to_be_empty()
    assert any(s["name"] == "cam2" for s in server.json("/v1/streams")["streams"])
    console.screenshot("streams")
    page.once("dialog", lambda d: d.accept())
    row.get_by_role("button", name="Remove cam2").click()
    expect(row).to_have_count(0)


def test_the_playground_shows_the_apis_detections(console, server):
    page = console.open("/playground")
    expect(page.get_by_label("Model")).to_contain_text("yolo11n")
    page.get_by_label("Confidence").fill("0.3")
    page.get_by_label("Drop an image here, or choose one:").set_input_files(str(PHOTO))
    expect(page.locator("#pg-status")).to_contain_text("detections by yolo11n")
    shown = json.loads(page.locator("#pg-json").inner_text())
    api = server.json("/v1/detect?conf=0.3", data=PHOTO.read_bytes(), content_type="image/jpeg")
    strip = lambda ds: [(d["class_name"], [round(v, 1) for v in d["box"]], round(d["score"], 4)) for d in ds]
    assert strip(shown["detections"]) == strip(api["detections"])
    assert len(api["detections"]) > 0
    canvas = page.locator("main canvas")
    expect(canvas).to_have_attribute("data-boxes", str(len(api["detections"])))
    expect(page.locator("#pg-curl")).to_contain_text("/v1/detect?conf=0.3")
    expect(page.locator("#pg-curl")).not_to_contain_text(server.key)
    console.screenshot("playground")


def test_a_zone_drawn_in_the_editor_makes_events_that_the_events_page_lists(console, server):
    page = console.open("/streams/cam1")
    canvas = page.locator(".editor canvas")
    expect(canvas).to_have_attribute("data-draft", "0")
    page.get_by_label("Kind").select_option("zone")
    page.get_by_label("Name", exact=True).fill("yard")
    box = canvas.bounding_box()
    corners = [(0.02, 0.02), (0.98, 0.02), (0.98, 0.98), (0.02, 0.98)]
    for x, y in corners:
        canvas.click(position={"x": box["width"] * x, "y": box["height"] * y})
    expect(canvas).to_have_attribute("data-draft", "4")
    page.get_by_role("button", name="Save").click()
    expect(page.locator("main li", has_text="yard (zone")).to_be_visible()
    yard = [z for z in server.json("/v1/streams/cam1/zones")["zones"] if z["name"] == "yard"]
    assert len(yard) == 1 and yard[0]["units"] == "normalized"
    for (x, y), (px, py) in zip(corners, yard[0]["points"]):
        assert abs(px - x) < 0.01 and abs(py - y) < 0.01, yard[0]["points"]
    console.screenshot("zones")

    page.goto(f"{server.base}/ui#/events")
    page.get_by_label("Type").select_option("zone.enter")
    page.get_by_label("Zone", exact=True).fill("yard")
    rows = page.locator("tbody tr[data-type='zone.enter']")
    # The events page shows a query's answer; asking again is how a user waits for more.
    for _ in range(30):
        page.get_by_role("button", name="Search").click()
        try:
            expect(rows.first).to_be_visible(timeout=2_000)
            break
        except AssertionError:
            pass
    expect(rows.first).to_contain_text("zone yard")
    page.wait_for_function(
        "() => [...document.querySelectorAll('tbody img.thumb')].some(i => i.complete && i.naturalWidth > 0)")
    console.screenshot("events")
    rows.first.get_by_role("link").click()
    expect(page.get_by_label("Event JSON")).to_contain_text('"type": "zone.enter"')


def test_models_shows_the_repository_and_health(console, server):
    page = console.open("/models")
    repo = page.get_by_role("table", name="Model repository")
    row = repo.locator("tr[data-model=yolo11n]")
    expect(row).to_contain_text("READY")
    expect(row).to_contain_text("serving")
    health = page.get_by_role("table", name="Model health").locator("tr[data-model=yolo11n]")
    expect(health).to_contain_text(re.compile(r"v1: [0-9.]+ ms"))
    expect(page.locator("#server-health")).to_contain_text("ready")
    console.screenshot("models")


def test_every_page_fits_a_phone_and_works_from_the_keyboard(console, server):
    page = console.open("/live")
    page.set_viewport_size({"width": 390, "height": 844})
    # Each page with its content in (the first row or tile it fetches).
    pages = {"/live": "article[data-stream=cam1] canvas[data-seq]", "/streams": "tr[data-stream=cam1]",
             "/events": "tbody tr >> nth=0", "/playground": "#pg-model option >> nth=1",
             "/models": "tr[data-model=yolo11n] >> nth=1"}
    for fragment, content in pages.items():
        page.goto(f"{server.base}/ui#{fragment}")
        expect(page.locator(content)).to_be_attached()
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"{fragment} scrolls sideways by {overflow}px"
    console.screenshot("phone-models")
    # The navigation is reachable with Tab and follows Enter.
    page.goto(f"{server.base}/ui#/live")
    page.reload()
    page.keyboard.press("Tab")
    expect(page.locator(":focus")).to_have_text("Skip to content")
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    expect(page.locator(":focus")).to_have_text("Streams")
    page.keyboard.press("Enter")
    expect(page.locator("main h1")).to_have_text("Streams")

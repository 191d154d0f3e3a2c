//! Behaviours the README promises, each checked against the real binary: request ids and
//! timing headers on `/v1/detect`, the server's default JSON log (one line per request, no
//! secrets), multipart order, and the reports of `bench`, `bench-model` and `bench-decode`.
//! The server tests share one server, started once for the whole binary.

mod common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::server::{post_image, Server};
use common::{image, image_bytes, peregrine, TempDir};
use serde_json::Value;

/// The server every test here talks to, with its default log format (JSON).
async fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    let server = SERVER.get_or_init(|| Server::start_for_the_process(&["--max-batch", "4"]));
    server.wait_ready().await;
    server
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// A generated request id: a UUID in its hyphenated form.
fn is_uuid(id: &str) -> bool {
    let groups: Vec<&str> = id.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups.iter().all(|g| g.chars().all(|c| c.is_ascii_hexdigit()))
}

fn request_id(r: &reqwest::Response) -> String {
    r.headers()["x-request-id"].to_str().unwrap().to_string()
}

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detect_echoes_a_given_request_id_and_generates_one_otherwise() {
    let server = server().await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/detect");
    let given = post_image(
        &client,
        &url,
        image_bytes("bus.jpg"),
        &[
            ("x-request-id", "chosen-by-the-client"),
            ("traceparent", TRACEPARENT),
        ],
    )
    .await;
    assert_eq!(given.status(), 200);
    assert_eq!(request_id(&given), "chosen-by-the-client");
    // Without traces configured the server takes no part in the caller's trace and
    // hands its context back unchanged.
    assert_eq!(given.headers()["traceparent"], TRACEPARENT);
    let mut generated = Vec::new();
    for _ in 0..2 {
        let r = post_image(&client, &url, image_bytes("bus.jpg"), &[]).await;
        assert_eq!(r.status(), 200);
        generated.push(request_id(&r));
    }
    assert!(generated.iter().all(|id| is_uuid(id)), "{generated:?}");
    assert_ne!(generated[0], generated[1], "each request gets its own");
    // Errors carry it too; one over 128 bytes is not echoed but replaced.
    let failed = post_image(
        &client,
        &url,
        b"garbage".to_vec(),
        &[("x-request-id", "failing-one")],
    )
    .await;
    assert_eq!(
        (failed.status().as_u16(), request_id(&failed)),
        (400, "failing-one".into())
    );
    let long = "x".repeat(129);
    let r = post_image(&client, &url, image_bytes("bus.jpg"), &[("x-request-id", &long)]).await;
    assert!(is_uuid(&request_id(&r)), "{}", request_id(&r));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detect_reports_its_stages_in_server_timing() {
    let server = server().await;
    let client = reqwest::Client::new();
    let r = post_image(&client, &server.url("/v1/detect"), image_bytes("zidane.jpg"), &[]).await;
    assert_eq!(r.status(), 200);
    let header = r.headers()["server-timing"].to_str().unwrap().to_string();
    let stages: Vec<(&str, f64)> = header
        .split(", ")
        .map(|entry| {
            let (name, dur) = entry
                .split_once(";dur=")
                .unwrap_or_else(|| panic!("{entry:?} in {header:?}"));
            (name, dur.parse().unwrap())
        })
        .collect();
    let names: Vec<&str> = stages.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["decode", "queue", "inference", "total"], "{header}");
    let [decode, queue, inference, total] = [0, 1, 2, 3].map(|i| stages[i].1);
    assert!(decode > 0.0 && inference > 0.0 && queue >= 0.0, "{header}");
    // One image passes through the stages one after another, inside the total (each
    // figure is rounded to a microsecond).
    assert!(decode + queue + inference <= total + 0.003, "{header}");
    let total_header: f64 = r.headers()["x-total-time-ms"].to_str().unwrap().parse().unwrap();
    assert_eq!(total_header, total, "the same figure in both headers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multipart_with_two_files_answers_both_in_order_with_their_names() {
    let server = server().await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/detect");
    // Not in name order, so an answer sorted by name would show.
    let names = ["zidane.jpg", "bus.jpg"];
    let mut form = reqwest::multipart::Form::new();
    for (field, name) in ["first", "second"].into_iter().zip(names) {
        form = form.part(
            field,
            reqwest::multipart::Part::bytes(image_bytes(name)).file_name(name),
        );
    }
    let r = client.post(&url).multipart(form).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{v}");
    for (result, name) in results.iter().zip(names) {
        assert_eq!(result["image"], name);
        // Each result is that image's own: as it is detected alone.
        let alone: Value = post_image(&client, &url, image_bytes(name), &[])
            .await
            .json()
            .await
            .unwrap();
        let classes = |dets: &Value| -> Vec<String> {
            let mut c: Vec<String> = dets
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["class_name"].as_str().unwrap().to_string())
                .collect();
            c.sort();
            c
        };
        assert_eq!(
            classes(&result["detections"]),
            classes(&alone["detections"]),
            "{name}"
        );
        assert_eq!(
            (result["width"].clone(), result["height"].clone()),
            (alone["width"].clone(), alone["height"].clone())
        );
    }
}

/// Polls the server's log until `done` holds of it, for at most 60 s.
async fn wait_for_log(server: &Server, what: &str, done: impl Fn(&[String]) -> bool) -> Vec<String> {
    let start = Instant::now();
    loop {
        let lines = server.logs.lock().unwrap().clone();
        if done(&lines) {
            return lines;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{what}: not in the log after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The JSON log lines about the request `id`.
fn lines_about(lines: &[String], id: &str) -> Vec<Value> {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["span"]["request_id"] == id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_log_has_one_line_per_request_and_no_secrets() {
    const TOKEN: &str = "tok-5ecret-never-logged";
    const PASSWORD: &str = "pw-5ecret-never-logged";
    let server = server().await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/detect");
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("authorization", bearer.as_str()), ("x-api-key", TOKEN)];
    let ok = post_image(
        &client,
        &url,
        image_bytes("bus.jpg"),
        &[auth[0], auth[1], ("x-request-id", "log-ok")],
    )
    .await;
    assert_eq!(ok.status(), 200);
    let bad = post_image(
        &client,
        &url,
        b"garbage".to_vec(),
        &[auth[0], ("x-request-id", "log-bad")],
    )
    .await;
    assert_eq!(bad.status(), 400);
    let unnamed = post_image(&client, &url, image_bytes("bus.jpg"), &[]).await;
    let generated = request_id(&unnamed);
    // A camera with a password in its URL, which nothing listens for: its supervisor
    // logs the failed connection.
    let camera = serde_json::json!({
        "name": "log-secret-cam",
        "url": format!("rtsp://admin:{PASSWORD}@127.0.0.1:9/stream"),
        "connect_timeout_ms": 200,
    });
    let added = client
        .post(server.url("/v1/streams"))
        .json(&camera)
        .send()
        .await
        .unwrap();
    assert!(added.status().is_success(), "{}", added.text().await.unwrap());
    let lines = wait_for_log(server, "the three requests and the camera", |lines| {
        ["log-ok", "log-bad", generated.as_str()]
            .iter()
            .all(|id| !lines_about(lines, id).is_empty())
            && lines.iter().any(|l| l.contains("log-secret-cam"))
    })
    .await;
    let removed = client
        .delete(server.url("/v1/streams/log-secret-cam"))
        .send()
        .await
        .unwrap();
    assert!(removed.status().is_success());

    for id in ["log-ok", generated.as_str()] {
        let about = lines_about(&lines, id);
        assert_eq!(about.len(), 1, "one line per request: {about:?}");
        let line = &about[0];
        assert_eq!(line["level"], "INFO", "{line}");
        assert_eq!(line["span"]["model"], "yolo11n", "{line}");
        assert_eq!(line["span"]["version"], "1", "{line}");
        assert_eq!(line["fields"]["message"], "detected", "{line}");
        assert_eq!(line["fields"]["status"], 200, "{line}");
    }
    let failed = lines_about(&lines, "log-bad");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["fields"]["status"], 400, "{}", failed[0]);
    assert!(failed[0]["fields"]["error"]
        .as_str()
        .is_some_and(|e| !e.is_empty()));
    // Every line is JSON, but for the addresses printed for scripts.
    for l in &lines {
        assert!(
            l.starts_with("peregrine: ") || serde_json::from_str::<Value>(l).is_ok(),
            "not JSON: {l}"
        );
    }
    let leaks: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains(TOKEN) || l.contains(PASSWORD))
        .collect();
    assert!(leaks.is_empty(), "secrets in the log: {leaks:?}");
}

/// Runs a benchmark command with `--output` and returns the JSON it wrote.
fn bench_report(dir: &TempDir, a: &[&str]) -> Value {
    let path = dir.path().join("report.json");
    let mut a = args(a);
    a.extend(["--output".to_string(), path.display().to_string()]);
    let out = peregrine(&a);
    assert!(
        out.status.success(),
        "peregrine {a:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_closed_loop_counts_every_request_once() {
    let server = server().await;
    let dir = TempDir::new("bench-closed");
    // Round robin over a good image and a bad one: every other request is refused.
    let garbage = dir.file("garbage.jpg", b"not a picture");
    let bus = image("bus.jpg");
    let r = bench_report(
        &dir,
        &[
            "bench",
            "--url",
            &server.base,
            "--concurrency",
            "2",
            "--requests",
            "6",
            "--duration",
            "60",
            &bus,
            &garbage,
        ],
    );
    assert_eq!(r["mode"], "closed");
    assert_eq!(
        (r["requests"].as_u64(), r["successes"].as_u64()),
        (Some(6), Some(3)),
        "{r}"
    );
    assert_eq!(r["errors"], serde_json::json!({"http_400": 3}), "{r}");
    let errors: u64 = r["errors"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(
        r["requests"].as_u64().unwrap(),
        r["successes"].as_u64().unwrap() + errors
    );
    let l = &r["latency_ms"];
    let (p50, p90, p99, max, mean) = (
        f(&l["p50"]),
        f(&l["p90"]),
        f(&l["p99"]),
        f(&l["max"]),
        f(&l["mean"]),
    );
    assert!(0.0 < p50 && p50 <= p90 && p90 <= p99 && p99 <= max, "{l}");
    assert!(0.0 < mean && mean <= max, "{l}");
    let s = &r["server_ms"];
    assert!(f(&s["decode_p50"]) > 0.0 && f(&s["inference_p50"]) > 0.0, "{s}");
    assert!(
        f(&s["queue_p50"]) <= f(&s["queue_p99"]) && f(&s["total_p50"]) <= f(&s["total_p99"]),
        "{s}"
    );
    assert!(f(&s["total_p50"]) >= f(&s["inference_p50"]), "{s}");
    // The server's own total is part of what the client measured.
    assert!(f(&s["total_p99"]) <= max, "{s} {l}");
    let throughput = f(&r["successes"]) / f(&r["duration_s"]);
    assert!(
        (f(&r["throughput_rps"]) - throughput).abs() < 1e-6 * throughput.max(1.0),
        "{r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_open_loop_sends_at_the_rate_asked_for() {
    let server = server().await;
    let dir = TempDir::new("bench-open");
    let bus = image("bus.jpg");
    let r = bench_report(
        &dir,
        &[
            "bench",
            "--url",
            &server.base,
            "--rate",
            "10",
            "--duration",
            "2",
            &bus,
        ],
    );
    assert_eq!(r["mode"], "open");
    // 10 a second for 2 s, whatever the server answers: sent on schedule at 0, 0.1, ... 1.9 s.
    assert_eq!(r["requests"], 20, "{r}");
    let errors: u64 = r["errors"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(
        r["requests"].as_u64().unwrap(),
        r["successes"].as_u64().unwrap() + errors,
        "{r}"
    );
    assert!(r["successes"].as_u64().unwrap() > 0, "{r}");
    let offered = f(&r["offered_rps"]);
    assert!(
        (offered - 10.0).abs() <= 0.5,
        "sent at {offered} req/s, asked for 10"
    );
    let l = &r["latency_ms"];
    assert!(
        f(&l["p50"]) <= f(&l["p99"]) && f(&l["p99"]) <= f(&l["max"]),
        "{l}"
    );
}

#[test]
fn bench_model_reports_each_batch_size_consistently() {
    let dir = TempDir::new("bench-model");
    let seconds = 0.3;
    let r = bench_report(
        &dir,
        &[
            "bench-model",
            "--threads",
            "1",
            "--batch",
            "1,2",
            "--seconds",
            "0.3",
            &image("bus.jpg"),
        ],
    );
    let figures = r.as_array().unwrap();
    let batches: Vec<u64> = figures.iter().map(|b| b["batch"].as_u64().unwrap()).collect();
    assert_eq!(batches, [1, 2], "{r}");
    for b in figures {
        let (batch, runs) = (f(&b["batch"]), f(&b["runs"]));
        assert!(runs >= 1.0, "{b}");
        assert!(
            0.0 < f(&b["batch_ms_p50"]) && f(&b["batch_ms_p50"]) <= f(&b["batch_ms_p99"]),
            "{b}"
        );
        // Images over a measured window of at least `seconds` (and not much more).
        let per_s = f(&b["images_per_s"]);
        assert!(per_s * seconds <= runs * batch * (1.0 + 1e-9), "{b}");
        assert!(per_s * (seconds + 10.0) >= runs * batch, "{b}");
        for stage in ["normalize_ms_mean", "model_ms_mean", "postprocess_ms_mean"] {
            assert!(f(&b[stage]) > 0.0, "{stage}: {b}");
        }
    }
}

#[test]
fn bench_decode_reports_each_thread_count_consistently() {
    let dir = TempDir::new("bench-decode");
    let seconds = 0.3;
    let r = bench_report(
        &dir,
        &[
            "bench-decode",
            "--threads",
            "1,2",
            "--seconds",
            "0.3",
            &image("bus.jpg"),
            &image("zidane.jpg"),
        ],
    );
    let figures = r.as_array().unwrap();
    let threads: Vec<u64> = figures.iter().map(|t| t["threads"].as_u64().unwrap()).collect();
    assert_eq!(threads, [1, 2], "{r}");
    for t in figures {
        let images = f(&t["images"]);
        assert!(images >= 2.0, "{t}");
        let per_s = f(&t["images_per_s"]);
        assert!(per_s * seconds <= images * (1.0 + 1e-9), "{t}");
        assert!(per_s * (seconds + 10.0) >= images, "{t}");
        assert!(
            f(&t["user_ms_per_image"]) + f(&t["system_ms_per_image"]) > 0.0,
            "{t}"
        );
    }
}

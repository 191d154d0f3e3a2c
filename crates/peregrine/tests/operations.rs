//! The operator's toolkit (issue 23) against the real server: a live CPU profile taken
//! under load, the metrics that the shipped dashboard and alert rules name, and each
//! version's fingerprint in the server's answers.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::image_bytes;
use common::server::{post_image, Server};
use serde_json::Value;
use sha2::Digest;

/// Metrics only a GPU server exports (NVML's gauges): allowed to be absent here.
const GPU_ONLY: &[&str] = &[
    "peregrine_gpu_utilization_ratio",
    "peregrine_gpu_memory_used_bytes",
    "peregrine_gpu_memory_total_bytes",
];

/// Metrics whose first series appears with the event they count, which this test does
/// not wait for or cause: each must still be a name the code defines.
const ON_EVENT: &[(&str, &str)] = &[
    // The clip's first objects appear within seconds; the test does not wait for them.
    (
        "peregrine_object_events_total",
        include_str!("../../video/src/telemetry.rs"),
    ),
    (
        "peregrine_stream_sink_dropped_events_total",
        include_str!("../../video/src/telemetry.rs"),
    ),
    (
        "peregrine_queue_dropped_total",
        include_str!("../../engine/src/telemetry.rs"),
    ),
];

/// Keeps `workers` clients posting images until `stop`; counts the answers.
fn load(
    server: &Server,
    workers: usize,
    stop: &Arc<AtomicBool>,
) -> (Arc<AtomicUsize>, Vec<tokio::task::JoinHandle<()>>) {
    let answered = Arc::new(AtomicUsize::new(0));
    let tasks = (0..workers)
        .map(|_| {
            let (client, url) = (reqwest::Client::new(), server.url("/v1/detect"));
            let (stop, answered, bytes) = (stop.clone(), answered.clone(), image_bytes("bus.jpg"));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let status = post_image(&client, &url, bytes.clone(), &[]).await.status();
                    assert!(status.is_success() || status == 429, "{status}");
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    (answered, tasks)
}

/// Whether the server handles SIGPROF, the profiler's sampling signal (`SigCgt` in
/// /proc/PID/status): only while a profile records.
fn samples_cpu(server: &Server) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    let caught = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .expect("a SigCgt line");
    let mask = u64::from_str_radix(caught.trim(), 16).unwrap();
    mask & (1 << (libc::SIGPROF - 1)) != 0
}

async fn get(url: &str) -> (u16, String, Vec<u8>) {
    let r = reqwest::get(url).await.unwrap();
    let status = r.status().as_u16();
    let content_type = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, content_type, r.bytes().await.unwrap().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_under_load_names_the_detector_functions() {
    let server = Server::start(&["--profiling", "true"]);
    server.wait_ready().await;
    let profile = |query: &str| server.url(&format!("/debug/pprof/profile?{query}"));
    for bad in ["seconds=0", "seconds=61", "seconds=x", "format=png"] {
        let (status, _, body) = get(&profile(bad)).await;
        assert_eq!(status, 400, "{bad}: {}", String::from_utf8_lossy(&body));
    }

    assert!(!samples_cpu(&server), "no profiler before a profile is asked for");
    let stop = Arc::new(AtomicBool::new(false));
    let (answered, loaders) = load(&server, 3, &stop);
    let url = profile("seconds=3&format=svg");
    let svg = tokio::spawn(async move { get(&url).await });
    let started = Instant::now();
    while !server
        .logs
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("CPU profile started"))
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the profile never started"
        );
        tokio::task::yield_now().await;
    }
    assert!(samples_cpu(&server), "sampling while the profile records");
    let (status, _, body) = get(&profile("seconds=1")).await;
    assert_eq!(status, 409, "a second profile at once is refused");
    assert!(String::from_utf8_lossy(&body).contains("already being recorded"));
    let (status, content_type, body) = svg.await.unwrap();
    let pprof = get(&profile("seconds=1&format=pprof")).await;
    stop.store(true, Ordering::Relaxed);
    for l in loaders {
        l.await.unwrap();
    }
    assert_eq!(status, 200);
    assert_eq!(content_type, "image/svg+xml");
    let svg = String::from_utf8(body).unwrap();
    assert!(svg.starts_with("<?xml"), "{}", &svg[..svg.len().min(200)]);
    assert!(answered.load(Ordering::Relaxed) > 0, "the load ran");
    // Decoding and letterboxing run in Rust on the preprocessing pool: their frames are
    // named whatever the model's runtime exports.
    for function in ["peregrine_vision", "peregrine_engine"] {
        assert!(
            svg.contains(function),
            "the flamegraph names no {function} function"
        );
    }

    assert!(!samples_cpu(&server), "no profiler once the profiles are done");
    let (status, content_type, body) = pprof;
    assert_eq!((status, content_type.as_str()), (200, "application/octet-stream"));
    assert!(body.len() > 100, "a pprof protobuf of {} bytes", body.len());

    let (status, _, body) = get(&server.url("/debug/pprof/heap")).await;
    let heap: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, 200, "{heap}");
    // The model's weights and ONNX Runtime's arena alone are tens of megabytes.
    assert!(heap["in_use_bytes"].as_u64().unwrap() > 20 << 20, "{heap}");
}

/// Every `peregrine_*` name in `text`, histogram series folded into their family.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("peregrine_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        names.insert(family.to_string());
        rest = &tail[end..];
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_alerts_name_only_exported_metrics_and_answers_carry_the_fingerprint() {
    // An objective, so that its gauge is exported; profiling stays off (the default).
    let server = Server::start(&["--slo-p99-ms", "60000"]);
    server.wait_ready().await;
    let (status, _, body) = get(&server.url("/debug/pprof/profile?seconds=1")).await;
    assert_eq!(status, 404);
    assert!(String::from_utf8_lossy(&body).contains("profiling is off"));
    assert_eq!(get(&server.url("/debug/pprof/heap")).await.0, 404);

    let client = reqwest::Client::new();
    let answer: Value = post_image(&client, &server.url("/v1/detect"), image_bytes("bus.jpg"), &[])
        .await
        .json()
        .await
        .unwrap();
    let weights =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/yolo11n.onnx")).unwrap();
    let sha256 = hex::encode(sha2::Sha256::digest(&weights));
    assert_eq!(answer["sha256"], sha256.as_str(), "{answer}");
    let model = answer["model"].as_str().unwrap();
    let index: Value = client
        .post(server.url("/v2/repository/index"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(index[0]["sha256"], sha256.as_str(), "{index}");
    let (_, _, metadata) = get(&server.url(&format!("/v2/models/{model}"))).await;
    let metadata: Value = serde_json::from_slice(&metadata).unwrap();
    assert_eq!(metadata["sha256"]["1"], sha256.as_str(), "{metadata}");

    let clip = common::shared_dir().join("videos/bikes.mp4");
    let added = client
        .post(server.url("/v1/streams"))
        .json(&serde_json::json!({ "name": "cam", "url": format!("file://{}", clip.display()), "realtime": true }))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201, "{}", added.text().await.unwrap());
    server
        .wait_for_metrics(
            "the stream's frames are detected",
            &[("peregrine_stream_frames_detected_total", "cam")],
            |v| v[0] >= 1.0,
        )
        .await;

    let exported = metric_names(&server.metrics_text().await);
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    let mut named = BTreeSet::new();
    for file in ["grafana/peregrine.json", "prometheus/alerts.yaml"] {
        named.extend(metric_names(&std::fs::read_to_string(deploy.join(file)).unwrap()));
    }
    assert!(named.len() >= 20, "{named:?}");
    let missing: Vec<&String> = named
        .iter()
        .filter(|n| !exported.contains(*n) && !GPU_ONLY.contains(&n.as_str()))
        .filter(|n| {
            ON_EVENT
                .iter()
                .find(|(name, _)| name == n)
                .is_none_or(|(name, source)| !source.contains(&format!("\"{name}\"")))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "named but not exported: {missing:?}; exported: {exported:?}"
    );
}

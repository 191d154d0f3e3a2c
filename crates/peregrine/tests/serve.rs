//! `peregrine serve` as a client meets it: the real binary on a free port, over HTTP.

mod common;

use std::time::Duration;

use common::server::{post_image, Server};
use common::{image_bytes, matches, reference, Det};
use serde_json::Value;

/// Sends `n` requests in the background to keep the model busy; yields their statuses.
fn occupy(client: &reqwest::Client, url: &str, n: usize) -> Vec<tokio::task::JoinHandle<u16>> {
    (0..n)
        .map(|_| {
            let (client, url, bytes) = (client.clone(), url.to_string(), image_bytes("bus.jpg"));
            tokio::spawn(async move { post_image(&client, &url, bytes, &[]).await.status().as_u16() })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_detections_match_the_reference() {
    // One instance that waits up to 50 ms for a batch to fill, so images sent together
    // are run together. The objective is far off, so adaptive batching keeps the limits;
    // the latency window is checked at the end.
    let server = Server::start(&[
        "--max-batch",
        "4",
        "--instances",
        "1",
        "--max-queue-delay-us",
        "50000",
        "--slo-p99-ms",
        "600000",
        "--slo-window-s",
        "60",
    ]);
    server.wait_ready().await;
    let client = reqwest::Client::new();
    let refs = reference("yolo11n");
    // All images at once, so they batch together.
    let futures = refs.iter().map(|(name, _)| {
        let (client, url) = (client.clone(), server.url("/v1/detect"));
        let bytes = image_bytes(name);
        async move {
            post_image(&client, &url, bytes, &[])
                .await
                .json::<Value>()
                .await
                .unwrap()
        }
    });
    let answers = futures_util::future::join_all(futures).await;
    let (mut total, mut ours, mut matched) = (0, 0, 0);
    let batch_sizes: Vec<u64> = answers
        .iter()
        .map(|a| a["timings"]["batch_size"].as_u64().unwrap())
        .collect();
    assert!(
        batch_sizes.iter().all(|&b| (1..=4).contains(&b)) && batch_sizes.iter().any(|&b| b > 1),
        "images sent together are batched, up to --max-batch: {batch_sizes:?}"
    );
    assert_eq!(answers.len(), refs.len());
    for ((name, ref_dets), answer) in refs.iter().zip(&answers) {
        assert_eq!(answer["model"], "yolo11n", "{name}: {answer}");
        assert_eq!(answer["version"], "1");
        let dets = Det::list(&answer["detections"]);
        total += ref_dets.len();
        ours += dets.len();
        matched += matches(ref_dets, &dets);
    }
    assert!(
        matched as f64 >= 0.99 * total as f64,
        "{matched} of {total} reference detections"
    );
    assert!(
        matched as f64 >= 0.99 * ours as f64,
        "{matched} of {ours} of ours"
    );
    // The slowest answer, as the client saw it, bounds the window's P99 from above.
    let slowest_ms = answers
        .iter()
        .map(|a| a["timings"]["total_ms"].as_f64().unwrap_or(0.0))
        .fold(0.0, f64::max);
    let exported = server
        .wait_for_metrics(
            "the latency window is exported",
            &[
                ("peregrine_latency_p99_seconds", "version=\"1\""),
                ("peregrine_latency_objective_seconds", ""),
                ("peregrine_batch_limit", ""),
            ],
            |v| v[0] > 0.0,
        )
        .await;
    assert_eq!((exported[1], exported[2]), (600.0, 4.0), "{exported:?}");
    assert!(
        exported[0] * 1e3 <= slowest_ms * 1.02 + 1.0,
        "{exported:?} vs {slowest_ms} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_body_form_works_and_errors_are_json() {
    let server = Server::start(&["--max-body-bytes", "2000000", "--max-pixels", "1000000"]);
    server.wait_ready().await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/detect");

    // Multipart with two files, filtered to people, in request order.
    let form = reqwest::multipart::Form::new()
        .part(
            "a",
            reqwest::multipart::Part::bytes(image_bytes("zidane.jpg")).file_name("zidane.jpg"),
        )
        .part(
            "b",
            reqwest::multipart::Part::bytes(image_bytes("giraffe.jpg")).file_name("giraffe.jpg"),
        );
    let r = client
        .post(format!("{url}?classes=person"))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("x-inference-time-ms"));
    let v: Value = r.json().await.unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{v}");
    assert_eq!(results[0]["image"], "zidane.jpg");
    assert_eq!(results[1]["image"], "giraffe.jpg");
    let people = results[0]["detections"].as_array().unwrap();
    assert_eq!(
        people.len(),
        2,
        "the two people in zidane.jpg, and not the tie: {v}"
    );
    assert!(people.iter().all(|d| d["class_name"] == "person"));
    assert_eq!(
        results[1]["detections"].as_array().unwrap().len(),
        0,
        "no people in giraffe.jpg"
    );

    // JSON with base64 and options in the body.
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(image_bytes("zidane.jpg"));
    let r = client
        .post(&url)
        .json(&serde_json::json!({"image": b64, "conf": 0.8, "classes": ["person"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (v["width"].as_u64(), v["height"].as_u64()),
        (Some(1280), Some(720))
    );
    let confident = v["detections"].as_array().unwrap();
    assert_eq!(confident.len(), 1, "only the 0.86 person, not the 0.79 one: {v}");
    assert!(confident
        .iter()
        .all(|d| d["score"].as_f64().unwrap() > 0.8 && d["class_name"] == "person"));

    let cases: Vec<(reqwest::RequestBuilder, u16, &str)> = vec![
        (
            client
                .post(&url)
                .header("content-type", "image/jpeg")
                .body(b"garbage".to_vec()),
            400,
            "bad_image",
        ),
        (
            client
                .post(&url)
                .header("content-type", "image/png")
                .body(Vec::new()),
            400,
            "bad_image",
        ),
        (
            client.post(&url).header("content-type", "text/plain").body("hi"),
            415,
            "unsupported_media_type",
        ),
        (
            client.post(format!("{url}?conf=7")).body(image_bytes("bus.jpg")),
            400,
            "bad_request",
        ),
        (
            client
                .post(format!("{url}?classes=unicorn"))
                .body(image_bytes("bus.jpg")),
            400,
            "bad_request",
        ),
        (
            client
                .post(format!("{url}?model=nope"))
                .body(image_bytes("bus.jpg")),
            404,
            "unknown_model",
        ),
        (
            client.post(&url).body(vec![0u8; 3_000_000]),
            413,
            "body_too_large",
        ),
        // kite.jpg is 1352x900 = 1.2 MP, over the 1 MP limit set above.
        (
            client.post(&url).body(image_bytes("kite.jpg")),
            422,
            "image_too_large",
        ),
        (
            client.post(&url).json(&serde_json::json!({"image": "###"})),
            400,
            "bad_request",
        ),
        (client.get(server.url("/v2/nothing")), 404, "not_found"),
    ];
    for (req, status, code) in cases {
        let r = req.send().await.unwrap();
        assert_eq!(r.status().as_u16(), status, "expected {code}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], code, "{v}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    }

    let doc: Value = reqwest::get(server.url("/openapi.json"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(doc["paths"]["/v1/detect"].is_object());
    let bad = server
        .metric("peregrine_requests_total", "outcome=\"bad_input\"")
        .await;
    assert!(bad >= 8.0, "bad inputs are counted: {bad}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_beyond_capacity_gets_429_at_once() {
    let server = Server::start(&[
        "--max-in-flight",
        "3",
        "--queue-capacity",
        "2",
        "--max-batch",
        "1",
    ]);
    server.wait_ready().await;
    let client = reqwest::Client::new();
    let bytes = image_bytes("bus.jpg");
    let url = server.url("/v1/detect");
    let futures = (0..24).map(|_| post_image(&client, &url, bytes.clone(), &[]));
    let responses = futures_util::future::join_all(futures).await;
    let mut ok = 0;
    let mut rejected = 0;
    for r in responses {
        match r.status().as_u16() {
            200 => ok += 1,
            429 => {
                assert_eq!(r.headers()["retry-after"], "1");
                let v: Value = r.json().await.unwrap();
                assert!(
                    ["overloaded", "queue_full", "backlogged"]
                        .contains(&v["error"]["code"].as_str().unwrap()),
                    "{v}"
                );
                rejected += 1;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert!(ok >= 1 && rejected >= 10, "ok {ok}, rejected {rejected}");
    assert_eq!(
        server
            .metric("peregrine_requests_total", "outcome=\"rejected\"")
            .await,
        rejected as f64
    );
    // Rejected requests cost no inference.
    assert_eq!(
        server.metric("peregrine_inferred_images_total", "").await,
        ok as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_deadline_gets_504_and_no_inference() {
    // Early shedding would answer 429 here instead; this test is about the 504 path.
    // A 1280x1280 input makes each model run take hundreds of ms, so the four are in
    // flight together even on a fast machine (at 640 a CI machine answered them before
    // the gauge was ever seen at four).
    let server = Server::start(&[
        "--max-batch",
        "1",
        "--instances",
        "1",
        "--imgsz",
        "1280",
        "--shed-on-backlog",
        "false",
        // Four slow runs in a row must be answered, not expire.
        "--request-timeout-ms",
        "60000",
    ]);
    server.wait_ready().await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/detect");
    // Keep the only instance busy with four images ahead, all four admitted before the
    // next one is sent (they decode on the same pool ahead of it).
    let busy = occupy(&client, &url, 4);
    server
        .wait_for_metrics(
            "the four are in flight",
            &[("peregrine_in_flight_requests", "")],
            |v| v[0] >= 4.0,
        )
        .await;
    // Long enough to be decoded and queued, far too short for four model runs ahead.
    let r = post_image(
        &client,
        &url,
        image_bytes("zidane.jpg"),
        &[("x-request-timeout-ms", "250")],
    )
    .await;
    assert_eq!(r.status(), 504);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "deadline_exceeded");
    for b in busy {
        assert_eq!(b.await.unwrap(), 200);
    }
    // Once the queue has swept the request (if it expired there rather than before it was
    // queued), count: only the four were computed.
    let settled = server
        .wait_for_metrics(
            "the expired request is settled",
            &[
                ("peregrine_inferred_images_total", ""),
                ("peregrine_queue_dropped_total", "reason=\"expired\""),
                ("peregrine_deadline_exceeded_total", "stage=\"queued\""),
                // The handler's own timer may win the race with the queue's: it answers 504
                // and lets go, and the queue then drops the entry as abandoned.
                ("peregrine_queue_dropped_total", "reason=\"abandoned\""),
            ],
            |v| v[0] + v[1] + v[3] >= 4.0 + v[2],
        )
        .await;
    assert_eq!(settled[0], 4.0, "inferred images");
    assert_eq!(
        server
            .metric("peregrine_requests_total", "outcome=\"deadline\"")
            .await,
        1.0
    );
    // Under load the deadline may pass while decoding rather than queued; either way it
    // is counted once and never reaches the model (the engine's unit tests pin the queue
    // case down exactly).
    assert_eq!(server.metric("peregrine_deadline_exceeded_total", "").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_only_after_warm_up() {
    // Warming eight batch sizes (1 + 2 + ... + 8 images) takes seconds.
    let server = Server::start(&["--max-batch", "8", "--instances", "2"]);
    let client = reqwest::Client::new();
    let live = client.get(server.url("/health/live")).send().await.unwrap();
    assert_eq!(live.status(), 200);
    let ready = client.get(server.url("/health/ready")).send().await.unwrap();
    assert_eq!(ready.status(), 503, "ready before warm-up finished");
    let early = post_image(&client, &server.url("/v1/detect"), image_bytes("bus.jpg"), &[]).await;
    assert_eq!(early.status(), 503);
    assert_eq!(early.json::<Value>().await.unwrap()["error"]["code"], "not_ready");
    server.wait_ready().await;
    let r = post_image(&client, &server.url("/v1/detect"), image_bytes("bus.jpg"), &[]).await;
    assert_eq!(r.status(), 200);
    // Readiness lists where each instance runs.
    let ready: Value = client
        .get(server.url("/health/ready"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let instances = &ready["models"][0]["instances"];
    let serving_on_cpu = serde_json::json!({ "device": "cpu", "state": "serving" });
    assert_eq!(
        instances,
        &serde_json::json!([serving_on_cpu, serving_on_cpu]),
        "{ready}"
    );
    assert_eq!(
        server
            .metric("peregrine_instances", "device=\"cpu\",state=\"serving\"")
            .await,
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_then_exits() {
    // Slow runs at 1280 keep all three in flight together (see the deadline test).
    let mut server = Server::start(&[
        "--max-batch",
        "1",
        "--imgsz",
        "1280",
        "--shutdown-timeout-s",
        "60",
        "--request-timeout-ms",
        "60000",
    ]);
    server.wait_ready().await;
    let client = reqwest::Client::new();
    let in_flight: Vec<_> = (0..3)
        .map(|_| {
            let (client, url, bytes) = (client.clone(), server.url("/v1/detect"), image_bytes("bus.jpg"));
            tokio::spawn(async move { post_image(&client, &url, bytes, &[]).await.status().as_u16() })
        })
        .collect();
    server
        .wait_for_metrics(
            "three requests in flight",
            &[("peregrine_in_flight_requests", "")],
            |v| v[0] >= 3.0,
        )
        .await;
    server.terminate();
    for r in in_flight {
        assert_eq!(r.await.unwrap(), 200, "in-flight requests finish");
    }
    let status = server.wait_exit().await;
    assert!(status.success(), "clean exit: {status:?}");
    assert!(
        client.get(server.url("/health/live")).send().await.is_err(),
        "no longer accepting"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_is_dropped_before_its_batch() {
    // A 1280x1280 input makes each model run slow (hundreds of ms), which gives the timing
    // below wide margins even on a loaded machine.
    let server = Server::start(&[
        "--max-batch",
        "1",
        "--instances",
        "1",
        "--imgsz",
        "1280",
        "--shed-on-backlog",
        "false",
        // Six slow runs in a row can pass the default 10 s deadline on a loaded machine;
        // the busy requests must be answered, not expire.
        "--request-timeout-ms",
        "60000",
    ]);
    server.wait_ready().await;
    let client = reqwest::Client::new();
    let url = server.url("/v1/detect");
    let busy = occupy(&client, &url, 6);
    // Wait until most of them are decoded and queued, so the next request waits behind
    // several slow model runs.
    server
        .wait_for_metrics("the queue fills", &[("peregrine_queue_depth", "")], |v| {
            v[0] >= 4.0
        })
        .await;
    // This client gives up long before the requests ahead of it are done, and hangs up.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(1000))
        .build()
        .unwrap();
    let gone = impatient
        .post(&url)
        .header("content-type", "image/jpeg")
        .body(image_bytes("zidane.jpg"))
        .send()
        .await;
    assert!(gone.is_err(), "the impatient client timed out");
    for b in busy {
        assert_eq!(b.await.unwrap(), 200);
    }
    // The seventh request is either computed or dropped; wait for the one or the other.
    server
        .wait_for_metrics(
            "the abandoned request is settled",
            &[
                ("peregrine_inferred_images_total", ""),
                ("peregrine_queue_dropped_total", "reason=\"abandoned\""),
            ],
            |v| v[0] + v[1] >= 7.0,
        )
        .await;
    assert_eq!(
        server.metric("peregrine_inferred_images_total", "").await,
        6.0,
        "never computed"
    );
    assert_eq!(
        server
            .metric("peregrine_queue_dropped_total", "reason=\"abandoned\"")
            .await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewritten_graph_serves_the_same_detections_and_a_uint8_tensor_model() {
    let plain = Server::start(&["--graph-rewrite", "off"]);
    let rewritten = Server::start(&["--graph-rewrite", "on"]);
    // One session per padded size, each with its input shape fixed in its graph.
    let fixed = Server::start(&[
        "--graph-rewrite",
        "on",
        "--max-batch",
        "2",
        "--padded-batch-sizes",
        "1,2",
        "--session-per-batch-size",
        "true",
    ]);
    plain.wait_ready().await;
    rewritten.wait_ready().await;
    fixed.wait_ready().await;
    let client = reqwest::Client::new();
    for name in ["bus.jpg", "zidane.jpg"] {
        let mut answers = Vec::new();
        for server in [&plain, &rewritten, &fixed] {
            let r = post_image(&client, &server.url("/v1/detect"), image_bytes(name), &[]).await;
            assert_eq!(r.status(), 200);
            answers.push(r.json::<Value>().await.unwrap()["detections"].clone());
        }
        assert_eq!(answers[0], answers[1], "{name}");
        assert_eq!(answers[0], answers[2], "{name}: fixed-shape sessions");
    }
    // The tensor model is the graph as it runs: uint8 canvases in, candidate rows out.
    // Fixed per session, the batch is still dynamic for clients.
    let tensor_model = |server: &Server| client.get(server.url("/v2/models/yolo11n_tensor")).send();
    let fixed_meta: Value = tensor_model(&fixed).await.unwrap().json().await.unwrap();
    let meta: Value = tensor_model(&rewritten).await.unwrap().json().await.unwrap();
    assert_eq!(fixed_meta["inputs"], meta["inputs"]);
    assert_eq!(meta["inputs"][0]["datatype"], "UINT8");
    assert_eq!(meta["inputs"][0]["shape"], serde_json::json!([-1, 640, 640, 3]));
    assert_eq!(meta["outputs"][0]["name"], "candidates");
    assert_eq!(meta["outputs"][0]["shape"], serde_json::json!([-1, 1024, 6]));
    let gray = vec![114u8; 640 * 640 * 3];
    let header = serde_json::json!({
        "inputs": [{"name": "images_u8", "datatype": "UINT8", "shape": [1, 640, 640, 3],
                    "parameters": {"binary_data_size": gray.len()}}],
        "parameters": {"binary_data_output": true}
    })
    .to_string();
    let mut body = header.clone().into_bytes();
    body.extend_from_slice(&gray);
    let r = client
        .post(rewritten.url("/v2/models/yolo11n_tensor/infer"))
        .header("inference-header-content-length", header.len())
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let len: usize = r.headers()["inference-header-content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let bytes = r.bytes().await.unwrap();
    let head: Value = serde_json::from_slice(&bytes[..len]).unwrap();
    assert_eq!(head["outputs"][0]["shape"], serde_json::json!([1, 1024, 6]));
    assert_eq!(
        bytes.len() - len,
        1024 * 6 * 4,
        "only the candidate rows come back"
    );
}

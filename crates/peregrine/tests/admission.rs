//! Admission, readiness and shutdown as a load balancer sees them, against the real
//! server: 429 before the body is read (REST v1 and KServe v2), strict readiness after the
//! last model is unloaded, and the two-step drain (503 with `Connection: close` while the
//! admitted requests finish).

mod common;

use std::time::Duration;

use common::image_bytes;
use common::raw::RawRequest;
use common::server::Server;
use serde_json::Value;

/// A request whose body is half sent holds the server's only admission slot until `finish`.
async fn hold_the_only_slot(server: &Server) -> (RawRequest, Vec<u8>) {
    let bus = image_bytes("bus.jpg");
    let held = RawRequest::start(server, "/v1/detect", "image/jpeg", bus.len(), &bus[..1000]).await;
    server
        .wait_for_metrics(
            "the held request is in flight",
            &[("peregrine_in_flight_requests", "")],
            |v| v[0] >= 1.0,
        )
        .await;
    (held, bus[1000..].to_vec())
}

async fn a_full_server_refuses_before_reading_the_body(server: &Server) {
    let (mut held, rest) = hold_the_only_slot(server).await;
    let kserve_head = br#"{"inputs":[{"name":"IMAGE","datatype":"BYTES","shape":[1,1],"parameters":{"binary_data_size":999000}}]}"#;
    let routes: [(&str, &str, &[u8]); 3] = [
        ("/v1/detect", "image/jpeg", &[0xff, 0xd8, 0xff]),
        (
            "/v2/models/yolo11n/infer",
            "application/octet-stream",
            kserve_head,
        ),
        (
            "/v2/models/yolo11n/versions/1/infer",
            "application/octet-stream",
            kserve_head,
        ),
    ];
    for (path, content_type, part) in routes {
        // A megabyte announced, a few bytes sent, the rest never: only a server that does
        // not wait for the body can answer.
        let mut refused = RawRequest::start(server, path, content_type, 1_000_000, part).await;
        let (status, head) = refused.response_head().await;
        assert_eq!(status, 429, "{path}: {head}");
        assert!(head.contains("retry-after: 1"), "{path}: {head}");
    }
    held.send(&rest).await;
    assert_eq!(
        held.response_head().await.0,
        200,
        "the admitted request is answered"
    );
}

async fn unloading_the_last_model_makes_the_server_unready(server: &Server) {
    let client = reqwest::Client::new();
    let ready = || async {
        let r = client.get(server.url("/health/ready")).send().await.unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    assert_eq!(ready().await.0, 200);
    let unload = client
        .post(server.url("/v2/repository/models/yolo11n/unload"))
        .send()
        .await
        .unwrap();
    assert_eq!(unload.status(), 200);
    let (status, body) = ready().await;
    assert_eq!((status, &body["ready"]), (503, &Value::Bool(false)), "{body}");
    assert_eq!(body["models"][0]["ready"], false, "{body}");
    let kserve = client.get(server.url("/v2/health/ready")).send().await.unwrap();
    assert_eq!(kserve.status(), 503);
    let load = client
        .post(server.url("/v2/repository/models/yolo11n/load"))
        .send()
        .await
        .unwrap();
    assert_eq!(load.status(), 200, "{}", load.text().await.unwrap());
    assert_eq!(ready().await.0, 200, "ready again once the model is back");
}

async fn sigterm_answers_503_with_connection_close_until_in_flight_work_is_done(mut server: Server) {
    let (mut held, rest) = hold_the_only_slot(&server).await;
    server.terminate();
    // Readiness turns 503 and says why, and the listener still answers it.
    let client = reqwest::Client::new();
    let start = std::time::Instant::now();
    let ready = loop {
        let r = client.get(server.url("/health/ready")).send().await.unwrap();
        if r.status() == 503 {
            break r;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "readiness never turned 503"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(ready.headers()["connection"], "close");
    assert_eq!(ready.json::<Value>().await.unwrap()["draining"], true);
    // A new request is refused at once, and its connection closed.
    let bus = image_bytes("bus.jpg");
    let mut late = RawRequest::start(&server, "/v1/detect", "image/jpeg", bus.len(), &bus).await;
    let (status, head) = late.response_head().await;
    assert_eq!(status, 503, "{head}");
    assert!(head.contains("connection: close"), "{head}");
    late.closed_by_server().await;
    // The request admitted before the signal still completes, then the server exits.
    held.send(&rest).await;
    let (status, head) = held.response_head().await;
    assert_eq!(status, 200, "{head}");
    let exit = server.wait_exit().await;
    assert!(exit.success(), "clean exit: {exit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_readiness_and_drain_as_a_load_balancer_sees_them() {
    let server = Server::start(&[
        "--max-in-flight",
        "1",
        "--body-timeout-ms",
        "120000",
        "--shutdown-timeout-s",
        "60",
    ]);
    server.wait_ready().await;
    a_full_server_refuses_before_reading_the_body(&server).await;
    unloading_the_last_model_makes_the_server_unready(&server).await;
    sigterm_answers_503_with_connection_close_until_in_flight_work_is_done(server).await;
}

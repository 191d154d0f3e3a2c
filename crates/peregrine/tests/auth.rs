//! API keys against the real server: keys made by `peregrine keys new`, one server with
//! a keys file for every HTTP check (401, 403, 429, the two header forms, scopes), the
//! keys never in its log; and a non-loopback address without keys refusing to start.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::server::{post_image, Server};
use common::{image_bytes, peregrine, TempDir};
use serde_json::Value;

/// A key made by `peregrine keys new` and its keys-file entry.
fn new_key(id: &str, scopes: &str) -> (String, String) {
    let out = peregrine(&["keys", "new", "--id", id, "--scopes", scopes].map(String::from));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let (key, entry) = stdout.split_once('\n').unwrap();
    assert!(key.starts_with("pk_") && !entry.contains(key), "{stdout}");
    (key.to_string(), entry.trim_start().to_string())
}

struct Keys {
    reader: String,
    ops: String,
    limited: String,
}

fn keys_file(dir: &TempDir) -> (String, Keys) {
    let (reader, reader_entry) = new_key("reader", "infer");
    let (ops, ops_entry) = new_key("ops", "admin,infer");
    let (limited, limited_entry) = new_key("limited", "infer");
    let text = format!("{reader_entry}\n{ops_entry}\n{limited_entry}requests_per_s = 1\nburst = 1\n");
    (
        dir.file("keys.toml", text.as_bytes()),
        Keys { reader, ops, limited },
    )
}

async fn status_and_body(request: reqwest::RequestBuilder) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = request.send().await.unwrap();
    let (status, headers) = (r.status().as_u16(), r.headers().clone());
    (status, headers, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn keys_scopes_and_limits_are_enforced_and_never_logged() {
    let dir = TempDir::new("auth");
    let (file, keys) = keys_file(&dir);
    let server = Server::start(&["--api-keys-file", &file]);
    server.wait_ready().await;
    let client = reqwest::Client::new();
    let detect = server.url("/v1/detect");
    let bus = image_bytes("bus.jpg");

    // Refused requests are answered before their body is read (and the connection is then
    // closed): they send none, or a client writing a large one may see a broken pipe first.
    let (status, headers, body) = status_and_body(client.post(&detect)).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (401, &Value::from("missing_key")),
        "{body}"
    );
    assert_eq!(headers["www-authenticate"], "Bearer");
    let wrong = client.post(&detect).header("authorization", "Bearer pk_wrong");
    assert_eq!(status_and_body(wrong).await.0, 401);

    let bearer = format!("Bearer {}", keys.reader);
    let ok = post_image(&client, &detect, bus.clone(), &[("authorization", &bearer)]).await;
    assert_eq!(ok.status(), 200);
    let body: Value = ok.json().await.unwrap();
    assert!(!body["detections"].as_array().unwrap().is_empty(), "{body}");
    let ok = post_image(&client, &detect, bus.clone(), &[("x-api-key", &keys.reader)]).await;
    assert_eq!(ok.status(), 200, "the x-api-key form");

    let streams = client
        .post(server.url("/v1/streams"))
        .header("x-api-key", &keys.reader);
    let (status, _, body) =
        status_and_body(streams.json(&serde_json::json!({"name": "x", "url": "rtsp://h/x"}))).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (403, &Value::from("forbidden")),
        "{body}"
    );

    // One request a second: a quick run of requests meets the limit within a few.
    let metadata = server.url("/v2/models/yolo11n");
    let mut limited = None;
    for _ in 0..20 {
        let (status, headers, body) =
            status_and_body(client.get(&metadata).header("x-api-key", &keys.limited)).await;
        if status == 429 {
            limited = Some((headers, body));
            break;
        }
        assert_eq!(status, 200, "{body}");
    }
    let (headers, body) = limited.expect("the limited key met its rate limit");
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    assert!(headers["retry-after"].to_str().unwrap().parse::<u64>().unwrap() >= 1);
    let (status, _, _) = status_and_body(client.get(&metadata).header("x-api-key", &keys.reader)).await;
    assert_eq!(status, 200, "limits are per key");

    let health = client.get(server.url("/health/live")).send().await.unwrap();
    assert_eq!(health.status(), 200, "health is open by default");
    // Profiles need admin; this server has profiling off, which only an admin learns.
    let profile = server.url("/debug/pprof/profile?seconds=1");
    let (status, _, _) = status_and_body(client.get(&profile).header("authorization", &bearer)).await;
    assert_eq!(status, 403, "an infer key cannot profile");
    let (status, _, body) = status_and_body(client.get(&profile).header("x-api-key", &keys.ops)).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &Value::from("profiling_off")),
        "{body}"
    );
    let unload = server.url("/v2/repository/models/yolo11n/unload");
    let (status, _, body) = status_and_body(client.post(&unload).header("authorization", &bearer)).await;
    assert_eq!(status, 403, "an infer key cannot unload: {body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("\"admin\""),
        "{body}"
    );
    let (status, _, body) = status_and_body(client.post(&unload).header("x-api-key", &keys.ops)).await;
    assert_eq!(status, 200, "{body}");

    let metrics = server.metrics_text().await;
    let count = |labels: &str| common::server::sum_series(&metrics, "peregrine_auth_requests_total", labels);
    assert!(count(r#"key_id="reader",outcome="allowed""#) >= 2.0, "{metrics}");
    assert!(
        count(r#"key_id="unknown",outcome="unknown_key""#) >= 1.0,
        "{metrics}"
    );
    assert!(
        count(r#"key_id="limited",outcome="rate_limited""#) >= 1.0,
        "{metrics}"
    );

    let logs = server.logs.lock().unwrap().join("\n");
    assert!(logs.contains("refused"), "refusals are logged: {logs}");
    for key in [&keys.reader, &keys.ops, &keys.limited] {
        assert!(!logs.contains(key.as_str()), "a key reached the log");
    }
    assert!(!logs.contains("pk_wrong"), "a presented key reached the log");
}

#[test]
fn a_non_loopback_address_without_keys_refuses_to_start() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_peregrine"))
        .args(["serve", "--host", "0.0.0.0", "--port", "0", "--grpc-port", "0"])
        .env("PEREGRINE_EVENTS_DB", "none")
        .env_remove("PEREGRINE_API_KEYS_FILE")
        .env_remove("PEREGRINE_ALLOW_ANONYMOUS")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the server started on 0.0.0.0 without keys");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    for way in ["--api-keys-file", "--host 127.0.0.1", "--allow-anonymous"] {
        assert!(stderr.contains(way), "{stderr}");
    }
    assert!(!stderr.contains("listening"), "{stderr}");
}

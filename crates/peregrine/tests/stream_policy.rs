//! The stream URL policy against the real server: streams whose URL names a file outside
//! the file roots or a loopback, link-local or metadata host are refused with 400 and the
//! reason, nothing of them is opened, and every refusal is logged without the URL's
//! password. One server for the file, with one file root and no allowed hosts.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::server::Server;
use common::{peregrine, shared_dir};
use serde_json::{json, Value};

const PASSWORD: &str = "pa55-policy";

struct Fixture {
    server: Server,
    /// The one file root.
    root: PathBuf,
    /// A named pipe beside the root: opening it for reading would block until a writer
    /// comes, so a reader on it shows that the server tried to open it.
    trap: PathBuf,
}

/// `<target tmp>/stream-policy/{root/, trap.mp4}`, made afresh.
fn files() -> (PathBuf, PathBuf) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stream-policy");
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let trap = dir.join("trap.mp4");
    let c_path = std::ffi::CString::new(trap.display().to_string()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0, "mkfifo");
    (root, trap)
}

async fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    let f = FIXTURE.get_or_init(|| {
        let (root, trap) = files();
        let roots = format!("{},{}", root.display(), shared_dir().join("videos").display());
        // The harness allows 127.0.0.1 by environment; the empty flag beats it.
        let server =
            Server::start_for_the_process(&["--stream-file-roots", &roots, "--stream-allow-hosts", ""]);
        Fixture { server, root, trap }
    });
    f.server.wait_ready().await;
    f
}

async fn add(server: &Server, body: Value) -> (u16, Value) {
    let r = server.post_json("/v1/streams", &body).await;
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Whether something holds the pipe open for reading (a write end opens without waiting
/// only then).
fn pipe_has_a_reader(trap: &PathBuf) -> bool {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(trap)
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_urls_answer_400_with_the_reason_open_nothing_and_are_logged() {
    let f = fixture().await;
    let escape = format!("{}/../trap.mp4", f.root.display());
    let cases = [
        ("passwd", "file:///etc/passwd".to_string(), "is not under a directory of stream_policy.file_roots"),
        ("escape", escape, "is not under a directory of stream_policy.file_roots"),
        (
            "metadata",
            format!("rtsp://admin:{PASSWORD}@169.254.169.254/x"),
            "stream url refused: host 169.254.169.254 is a cloud metadata address; allow it with stream_policy.allow_hosts",
        ),
        ("linklocal", "rtsp://169.254.10.1:80/x".into(), "link-local"),
        ("mapped", "rtsp://[::ffff:127.0.0.1]/".into(), "host [::ffff:127.0.0.1] is a loopback address"),
        ("localhost", "rtsp://localhost/".into(), "host localhost resolves to"),
        ("decimal", "rtsp://2130706433/".into(), "a number in a form other than a.b.c.d"),
        ("userinfo", "rtsp://10.0.0.5@127.0.0.1/".into(), "host 127.0.0.1 is a loopback address"),
    ];
    for (name, url, reason) in &cases {
        let (status, body) = add(&f.server, json!({ "name": name, "url": url })).await;
        assert_eq!(status, 400, "{name}: {body}");
        assert_eq!(body["error"]["code"], "stream_url_refused", "{name}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("stream url refused: "), "{name}: {message}");
        assert!(message.contains(reason), "{name}: {message}");
        assert!(!message.contains(PASSWORD), "{message}");
    }
    assert!(
        !pipe_has_a_reader(&f.trap),
        "the server opened the file outside its root"
    );
    let list: Value = reqwest::get(f.server.url("/v1/streams"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = list["streams"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    for (name, ..) in &cases {
        assert!(
            !names.contains(name),
            "the refused stream {name} was started: {list}"
        );
    }
    let started = Instant::now();
    loop {
        let logs = f.server.logs.lock().unwrap().clone();
        let refusals: Vec<&String> = logs
            .iter()
            .filter(|l| l.contains("stream url refused by the stream policy"))
            .collect();
        let logged = |name: &str| {
            refusals
                .iter()
                .any(|l| l.contains(&format!("\"stream\":\"{name}\"")))
        };
        if cases.iter().all(|(name, ..)| logged(name)) {
            assert!(
                logs.iter().all(|l| !l.contains(PASSWORD)),
                "a password reached the log"
            );
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "refusals not all logged: {refusals:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_under_a_root_runs() {
    let f = fixture().await;
    let clip = shared_dir().join("videos/bikes.mp4");
    let body = json!({ "name": "allowed", "url": format!("file://{}", clip.display()), "realtime": false });
    let (status, body) = add(&f.server, body).await;
    assert!((200..300).contains(&status), "{status}: {body}");
    let started = Instant::now();
    loop {
        let report: Value = reqwest::get(f.server.url("/v1/streams/allowed"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if report["counters"]["frames_detected"].as_u64() > Some(0) {
            // Not asked for: one frame in detection at once.
            assert_eq!(report["config"]["detect_in_flight"], 1, "{report}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no frame detected: {report}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let removed = reqwest::Client::new()
        .delete(f.server.url("/v1/streams/allowed"))
        .send()
        .await
        .unwrap();
    assert!(removed.status().is_success());
}

#[test]
fn a_refused_stream_in_the_config_file_stops_the_start() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stream-policy-config");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("serve.toml");
    std::fs::write(&config, "[[streams]]\nname = \"passwd\"\nurl = \"/etc/passwd\"\n").unwrap();
    let out = peregrine(&[
        "serve".into(),
        "--config".into(),
        config.display().to_string(),
        "--port".into(),
        "0".into(),
        "--host".into(),
        "127.0.0.1".into(),
        "--allow-grpc".into(),
        "false".into(),
        "--events-db".into(),
        "none".into(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "stream url refused: file streams are off; allow a directory with stream_policy.file_roots"
        ),
        "{stderr}"
    );
}

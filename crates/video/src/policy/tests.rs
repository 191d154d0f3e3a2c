//! The policy over URLs as the config parses them, with a resolver that answers from a
//! table (no DNS) and files in a temporary directory.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;

use super::*;
use crate::config::{SourceUrl, StreamConfig};

/// Answers from a table; a name not in it does not resolve. Records every question.
#[derive(Default)]
struct TableResolver {
    answers: HashMap<String, Vec<IpAddr>>,
    asked: Mutex<Vec<String>>,
}

impl HostResolver for TableResolver {
    fn resolve(&self, host: &str, _port: u16) -> BoxFuture<'static, std::io::Result<Vec<IpAddr>>> {
        self.asked.lock().unwrap().push(host.to_string());
        let answer = self
            .answers
            .get(host)
            .cloned()
            .ok_or_else(|| std::io::Error::other("no such host"));
        Box::pin(async move { answer })
    }
}

fn resolver(table: &[(&str, &[&str])]) -> Arc<TableResolver> {
    Arc::new(TableResolver {
        answers: table
            .iter()
            .map(|(h, a)| (h.to_string(), a.iter().map(|a| a.parse().unwrap()).collect()))
            .collect(),
        asked: Mutex::default(),
    })
}

fn policy_with(settings: StreamPolicy, table: &[(&str, &[&str])]) -> UrlPolicy {
    UrlPolicy::new(&settings, resolver(table)).unwrap()
}

fn source(url: &str) -> SourceUrl {
    StreamConfig::new("cam", url).source_url().unwrap()
}

async fn judge(policy: &UrlPolicy, url: &str) -> Result<(), UrlRefusal> {
    policy.admit(&source(url)).await
}

#[tokio::test]
async fn refuses_local_and_metadata_hosts_in_every_spelling() {
    let policy = policy_with(
        StreamPolicy::default(),
        &[
            ("localhost", &["127.0.0.1", "::1"]),
            ("rebind.example", &["192.168.1.9", "169.254.169.254"]),
        ],
    );
    let cases = [
        (
            "rtsp://169.254.169.254/x",
            "host 169.254.169.254 is a cloud metadata address",
        ),
        ("rtsp://169.254.1.1:80/x", "link-local"),
        ("rtsp://127.0.0.1:8554/cam", "loopback"),
        ("rtsp://[::1]/", "host [::1] is a loopback"),
        ("rtsp://[::ffff:127.0.0.1]/", "loopback"),
        ("rtsp://[::ffff:7f00:1]/", "loopback"),
        ("rtsp://[fe80::1]/", "link-local"),
        ("rtsp://[fd00:ec2::254]/", "metadata"),
        ("rtsp://100.100.100.200/", "metadata"),
        ("rtsp://0.0.0.0/", "unspecified"),
        ("rtsp://239.1.1.1/", "multicast"),
        ("rtsp://255.255.255.255/", "broadcast"),
        (
            "rtsp://localhost/",
            "host localhost resolves to 127.0.0.1, a loopback address",
        ),
        ("rtsp://LOCALHOST/", "loopback"),
        ("rtsp://rebind.example/", "resolves to 169.254.169.254"),
        // userinfo that looks like an allowed host: the host is what follows the last '@'.
        ("rtsp://192.168.1.5@169.254.169.254/", "metadata"),
        ("rtsp://user:pw@192.168.1.5:554@127.0.0.1/", "loopback"),
        ("rtsp://2130706433/", "a number in a form other than a.b.c.d"),
        ("rtsp://0x7f.1/", "dotted quad"),
        ("rtsp://0177.0.0.1/", "dotted quad"),
        ("rtsp://127.1/", "dotted quad"),
        ("rtsp://%6c%6f%63%61%6c%68%6f%73%74/", "not a plain host name"),
        ("rtsp:///path", "no host"),
    ];
    // A name that does not resolve is let in, and refused before each connection.
    judge(&policy, "rtsp://nowhere.example/").await.unwrap();
    let unresolved = policy
        .rtsp_address(&Url::parse("rtsp://nowhere.example/").unwrap())
        .await
        .unwrap_err();
    assert!(
        unresolved
            .to_string()
            .contains("host nowhere.example does not resolve"),
        "{unresolved}"
    );
    for (url, want) in cases {
        let refusal = judge(&policy, url).await.expect_err(url);
        let message = refusal.to_string();
        assert!(message.contains(want), "{url}: {message}");
        if matches!(refusal, UrlRefusal::Address { .. }) {
            assert!(
                message.ends_with("allow it with stream_policy.allow_hosts"),
                "{message}"
            );
        }
    }
}

#[tokio::test]
async fn allows_lan_cameras_and_what_allow_hosts_names() {
    let table: &[(&str, &[&str])] = &[
        ("cam.lan", &["192.168.1.64"]),
        ("localhost", &["127.0.0.1", "::1"]),
        ("metadata.internal", &["169.254.169.254"]),
    ];
    let default = policy_with(StreamPolicy::default(), table);
    for url in [
        "rtsp://10.0.0.5/stream1",
        "rtsp://u:p@172.16.0.2:8554/x",
        "rtsp://cam.lan/live",
        "rtsp://[fd12::5]/",
    ] {
        judge(&default, url)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
    }
    let allowing = policy_with(
        StreamPolicy {
            allow_hosts: vec!["127.0.0.1".into(), "::1".into(), "metadata.internal".into()],
            ..StreamPolicy::default()
        },
        table,
    );
    for url in [
        "rtsp://127.0.0.1:8554/cam",
        "rtsp://localhost:8554/cam",
        "rtsp://[::ffff:127.0.0.1]/",
        "rtsp://metadata.internal/",
    ] {
        judge(&allowing, url)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
    }
    assert!(
        judge(&allowing, "rtsp://127.0.0.2/").await.is_err(),
        "one address is not its /8"
    );
    assert!(
        judge(&allowing, "rtsp://169.254.169.254/").await.is_err(),
        "a name does not allow its address"
    );
}

#[tokio::test]
async fn the_address_connected_to_is_the_one_judged_now() {
    let table = resolver(&[("cam.lan", &["192.168.1.64"])]);
    let policy = UrlPolicy::new(&StreamPolicy::default(), table.clone()).unwrap();
    let url: Url = "rtsp://cam.lan:8554/x".parse().unwrap();
    assert_eq!(
        policy.rtsp_address(&url).await,
        Ok("192.168.1.64".parse().unwrap())
    );
    policy.rtsp_address(&url).await.unwrap();
    assert_eq!(
        *table.asked.lock().unwrap(),
        ["cam.lan", "cam.lan"],
        "resolved on every check"
    );
}

#[tokio::test]
async fn schemes_are_those_allowed() {
    let only_rtsps = policy_with(
        StreamPolicy {
            allowed_schemes: vec!["rtsps".into()],
            ..StreamPolicy::default()
        },
        &[],
    );
    let refusal = judge(&only_rtsps, "rtsp://10.0.0.5/x")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refusal.contains("scheme rtsp is not allowed (allowed: rtsps)"),
        "{refusal}"
    );
    let refusal = judge(&only_rtsps, "/work/shared/videos/bikes.mp4")
        .await
        .unwrap_err();
    assert_eq!(
        refusal,
        UrlRefusal::NoFileRoots,
        "no roots: no files, whatever the schemes"
    );
    for bad in [vec!["http".to_string()], vec!["file".to_string()]] {
        let settings = StreamPolicy {
            allowed_schemes: bad,
            ..StreamPolicy::default()
        };
        let e = UrlPolicy::new(&settings, Arc::new(SystemResolver)).unwrap_err();
        assert!(e.contains("allowed_schemes"), "{e}");
    }
    let e = UrlPolicy::new(
        &StreamPolicy {
            file_roots: vec!["/no/such/dir".into()],
            ..StreamPolicy::default()
        },
        Arc::new(SystemResolver),
    )
    .unwrap_err();
    assert!(e.contains("/no/such/dir"), "{e}");
}

/// `root/videos/clip.mp4`, `root/videos/sub/`, `root/outside.mp4`, a link inside pointing out, a link
/// inside pointing in.
fn file_tree() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let videos = dir.path().join("videos");
    std::fs::create_dir_all(videos.join("sub")).unwrap();
    std::fs::write(videos.join("clip.mp4"), b"x").unwrap();
    std::fs::write(dir.path().join("outside.mp4"), b"x").unwrap();
    std::os::unix::fs::symlink(dir.path().join("outside.mp4"), videos.join("out-link.mp4")).unwrap();
    std::os::unix::fs::symlink(videos.join("clip.mp4"), videos.join("in-link.mp4")).unwrap();
    (dir, videos)
}

#[tokio::test]
async fn files_must_resolve_under_a_root() {
    let (dir, videos) = file_tree();
    let policy = policy_with(
        StreamPolicy {
            file_roots: vec![videos.clone()],
            ..StreamPolicy::default()
        },
        &[],
    );
    let canonical = videos.canonicalize().unwrap();
    let v = videos.display();
    for (url, opened) in [
        (format!("{v}/clip.mp4"), canonical.join("clip.mp4")),
        (format!("file://{v}/clip.mp4"), canonical.join("clip.mp4")),
        (format!("{v}/./sub/../clip.mp4"), canonical.join("clip.mp4")),
        (format!("{v}/in-link.mp4"), canonical.join("clip.mp4")),
        (format!("{v}/not-yet.mp4"), canonical.join("not-yet.mp4")),
    ] {
        let SourceUrl::File(path) = source(&url) else {
            panic!("{url} is a file")
        };
        assert_eq!(policy.file_path(&path), Ok(opened), "{url}");
    }
    for url in [
        format!("{v}/../outside.mp4"),
        format!("file://{v}/../outside.mp4"),
        format!("{v}/out-link.mp4"),
        format!("{v}2/clip.mp4"),
        "file:///etc/passwd".to_string(),
        "/etc/passwd".to_string(),
        format!("{v}/.."),
    ] {
        let refusal = judge(&policy, &url).await.expect_err(&url);
        assert!(
            matches!(
                refusal,
                UrlRefusal::OutsideRoots { .. } | UrlRefusal::Unreadable { .. }
            ),
            "{url}: {refusal}"
        );
    }
    let refusal = judge(&policy, "/etc/passwd").await.unwrap_err().to_string();
    assert!(
        refusal.contains("not under a directory of stream_policy.file_roots"),
        "{refusal}"
    );
    let off = policy_with(StreamPolicy::default(), &[]);
    let clip = format!("{v}/clip.mp4");
    assert_eq!(judge(&off, &clip).await, Err(UrlRefusal::NoFileRoots));
    drop(dir);
}

#[tokio::test]
async fn pushed_rtp_must_be_allowed_and_an_active_sender_is_judged() {
    let off = policy_with(StreamPolicy::default(), &[]);
    let refusal = judge(&off, "rtp://0.0.0.0:5004?format=ps").await.unwrap_err();
    assert!(
        refusal
            .to_string()
            .contains("scheme rtp is not allowed (allowed: rtsp, rtsps)"),
        "{refusal}"
    );
    let on = policy_with(
        StreamPolicy {
            allowed_schemes: vec!["rtp".into(), "rtp+tcp".into()],
            ..StreamPolicy::default()
        },
        &[("camera.example", &["10.0.0.7"])],
    );
    judge(&on, "rtp://0.0.0.0:5004?format=ps").await.unwrap();
    judge(&on, "rtp+tcp://0.0.0.0:5004").await.unwrap();
    judge(&on, "rtp+tcp://camera.example:5004?mode=active")
        .await
        .unwrap();
    let refusal = judge(&on, "rtp+tcp://127.0.0.1:5004?mode=active")
        .await
        .unwrap_err();
    assert!(refusal.to_string().contains("loopback"), "{refusal}");
}

#[test]
fn an_address_a_device_names_is_judged_like_a_cameras_host() {
    let default = policy_with(StreamPolicy::default(), &[]);
    assert!(default.peer_address("192.168.1.64".parse().unwrap()).is_ok());
    for refused in ["127.0.0.1", "169.254.169.254", "0.0.0.0", "::1"] {
        let refusal = default.peer_address(refused.parse().unwrap()).unwrap_err();
        assert!(
            matches!(refusal, UrlRefusal::Address { .. }),
            "{refused}: {refusal}"
        );
    }
    let loopback_allowed = StreamPolicy {
        allow_hosts: vec!["127.0.0.1".into()],
        ..StreamPolicy::default()
    };
    let allowing = policy_with(loopback_allowed, &[]);
    assert!(allowing.peer_address("127.0.0.1".parse().unwrap()).is_ok());
}

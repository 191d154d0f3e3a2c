//! GB28181 end to end: the real server with its SIP server on, and simulated devices on
//! real sockets that register with digest credentials, answer the catalog query and
//! INVITEs, and push the bikes clip (muxed into PS by GStreamer's mpegpsmux) over RTP.
//! One server for every phase:
//! 1. a device over UDP, media over UDP with packets swapped and lost: people and bicycles
//!    are found; `GET /v1/gb28181/devices` lists it and its channel; its RTCP sender
//!    reports (on the port after RTP's) put capture times on its clock, 3 s behind;
//! 2. its keepalives stop: the server marks it offline and ends the play with a BYE; the
//!    stream backs off; the device registers again and the stream resumes on its own;
//! 3. removing the stream sends a BYE;
//! 4. a device over TCP (SIP and media, the device connecting for one channel and the
//!    server for the other) with two channels pushed frame by frame together: both streams
//!    detect, their capture times agree within 3 ms, and their sender reports (in the
//!    TCP connections) put those times on the device's clock.

mod common;
#[path = "gb28181/device.rs"]
mod device;
#[allow(dead_code)]
#[path = "../../video/tests/support/rtp_pusher.rs"]
mod rtp_pusher;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::server::Server;
use common::TempDir;
use device::{DeviceState, Media};
use peregrine_gb28181::simulated::DeviceIdentity;
use rtp_pusher::{mux_ps, ps_frames, Impairment};
use serde_json::{json, Value};
use tokio::sync::mpsc;

const DOMAIN: &str = "3402000000";
const SERVER_ID: &str = "34020000002000000001";
const PASSWORD: &str = "gb-secret-1";
const UDP_DEVICE: &str = "34020000001320000001";
const TCP_DEVICE: &str = "34020000001320000002";
/// The devices' clocks run this far behind the real time; their RTCP sender reports say
/// so, and capture times follow their clocks.
const DEVICE_CLOCK_BEHIND: Duration = Duration::from_secs(3);

/// Camera channels: the UDP device's one, the TCP device's two.
const CHANNELS: [&str; 3] = [
    "34020000001310000001",
    "34020000001310000002",
    "34020000001310000003",
];

fn identity(id: &str, channels: Vec<String>, tcp: bool) -> DeviceIdentity {
    DeviceIdentity {
        id: id.into(),
        channels,
        domain: DOMAIN.into(),
        server_id: SERVER_ID.into(),
        password: PASSWORD.into(),
        address: String::new(),
        tcp,
        // Set by the device once it listens for TCP active media.
        media_port: 0,
    }
}

fn sip_address(server: &Server) -> SocketAddr {
    let logs = server.logs.lock().unwrap();
    let line = logs
        .iter()
        .find_map(|l| l.strip_prefix("peregrine: GB28181 SIP listening on "))
        .expect("the server reports its SIP address");
    line.trim().parse().unwrap()
}

/// Every stream's detection events, read from the server's Server-Sent Events.
async fn event_feed(server: &Server) -> mpsc::Receiver<Value> {
    let (tx, rx) = mpsc::channel(4096);
    let mut response = reqwest::get(server.url("/v1/streams/events")).await.unwrap();
    assert_eq!(response.status(), 200);
    tokio::spawn(async move {
        let mut text = String::new();
        while let Ok(Some(chunk)) = response.chunk().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = text.find("\n\n") {
                let block: String = text.drain(..end + 2).collect();
                if !block.contains("event: detection") {
                    continue;
                }
                let data: String = block.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
                if tx.send(serde_json::from_str(&data).unwrap()).await.is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// Waits until `stream`'s events have shown every class of `classes`; returns the events.
async fn wait_for_classes(
    feed: &mut mpsc::Receiver<Value>,
    stream: &str,
    classes: &[&str],
    within: Duration,
) -> Vec<Value> {
    let mut found = BTreeSet::new();
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    while !classes.iter().all(|c| found.contains(*c)) {
        let event = tokio::time::timeout_at(deadline, feed.recv())
            .await
            .unwrap_or_else(|_| panic!("{stream}: found only {found:?} within {within:?}"))
            .expect("the feed runs");
        if event["stream"] != stream {
            continue;
        }
        assert!(
            matches!(event["clock_source"].as_str(), Some("rtp" | "rtcp")),
            "{event}"
        );
        for d in event["detections"].as_array().unwrap() {
            found.insert(d["class_name"].as_str().unwrap().to_string());
        }
        events.push(event);
    }
    events
}

async fn get(server: &Server, path: &str) -> Value {
    reqwest::get(server.url(path))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn add_stream(server: &Server, name: &str, url: &str) {
    let body = json!({
        "name": name,
        "url": url,
        "fps": 4,
        "staleness_ms": 3000,
        "decode_threads": 1,
        "frame_timeout_ms": 3000,
        "backoff": { "first_retry_ms": 200, "initial_ms": 300, "max_ms": 1000 },
    });
    let r = server.post_json("/v1/streams", &body).await;
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
}

/// Polls until `done` holds, up to `within`.
async fn until(what: &str, within: Duration, mut done: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !done().await {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn media(frames: &Arc<Vec<rtp_pusher::PsFrame>>, impairment: Impairment, lockstep: usize) -> Media {
    Media {
        frames: frames.clone(),
        impairment,
        lockstep,
        rounds: 1,
        clock_behind: Some(DEVICE_CLOCK_BEHIND),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gb28181_devices_register_play_lose_keepalive_resume_and_stay_aligned() {
    let dir = TempDir::new("gb28181");
    let config = dir.file(
        "serve.toml",
        b"[gb28181]\nkeepalive_interval_s = 1\nkeepalive_misses = 2\ninvite_timeout_ms = 3000\nmedia_ports = \"31000-31099\"\n",
    );
    let server = Server::start_with_env(
        &["--config", &config, "--gb28181-listen", "127.0.0.1:0"],
        &[("PEREGRINE_GB28181_PASSWORD", PASSWORD)],
    );
    let ps = std::fs::read(mux_ps(&common::shared_dir().join("videos/bikes.mp4"), dir.path())).unwrap();
    let frames = Arc::new(ps_frames(&ps));
    let sip = sip_address(&server);
    server.wait_ready().await;
    let mut feed = event_feed(&server).await;

    // 1. UDP, with damage on the way.
    let udp_channel = CHANNELS[0].to_string();
    let damage = Impairment {
        swap_every: 23,
        drop: &[60, 150, 330],
    };
    let a = device::start(
        identity(UDP_DEVICE, vec![udp_channel.clone()], false),
        sip,
        media(&frames, damage, 1),
    )
    .await;
    until("the UDP device's catalog", Duration::from_secs(10), async || {
        let devices = get(&server, "/v1/gb28181/devices").await;
        devices["devices"][0]["channels"][0]["id"] == udp_channel.as_str()
    })
    .await;
    let listed = get(&server, &format!("/v1/gb28181/devices/{UDP_DEVICE}")).await;
    assert_eq!(listed["online"], true);
    assert_eq!(listed["transport"], "udp");
    let url = format!("gb28181://{UDP_DEVICE}/{udp_channel}");
    assert_eq!(listed["channels"][0]["url"], url.as_str());
    assert_eq!(
        server
            .metric("peregrine_gb28181_devices", "state=\"online\"")
            .await,
        1.0
    );
    add_stream(&server, "gb-udp", &url).await;
    wait_for_classes(
        &mut feed,
        "gb-udp",
        &["person", "bicycle"],
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(
        get(&server, &format!("/v1/gb28181/devices/{UDP_DEVICE}")).await["playing"],
        json!([udp_channel])
    );

    assert_eq!(server.metric("peregrine_gb28181_plays", "udp").await, 1.0);

    // 2. Keepalive loss, then the device registers again and the stream resumes.
    keepalive_loss_and_return(&server, &a, &mut feed).await;

    // 3. Removing the stream hangs up.
    let byes = a.byes.load(Ordering::Relaxed);
    let r = reqwest::Client::new()
        .delete(server.url("/v1/streams/gb-udp"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    until("the BYE after removal", Duration::from_secs(5), async || {
        a.byes.load(Ordering::Relaxed) > byes
    })
    .await;

    // 4. TCP, two channels together: aligned capture times.
    two_tcp_channels_stay_aligned(&server, sip, &frames, &mut feed).await;

    // Bad requests are refused with reasons.
    let r = reqwest::get(server.url("/v1/gb28181/devices/34020000001329999999"))
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let body = json!({ "name": "bad", "url": "gb28181://3402/1" });
    let r = server.post_json("/v1/streams", &body).await;
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("is not 20 digits"));
}

async fn keepalive_loss_and_return(server: &Server, a: &Arc<DeviceState>, feed: &mut mpsc::Receiver<Value>) {
    let byes = a.byes.load(Ordering::Relaxed);
    let plays = a.plays.load(Ordering::Relaxed);
    a.keepalives.store(false, Ordering::Relaxed);
    until(
        "offline after 2 missed keepalives",
        Duration::from_secs(8),
        async || get(server, &format!("/v1/gb28181/devices/{UDP_DEVICE}")).await["online"] == false,
    )
    .await;
    until(
        "the BYE of the lost device's play",
        Duration::from_secs(3),
        async || a.byes.load(Ordering::Relaxed) > byes,
    )
    .await;
    until("the stream backing off", Duration::from_secs(5), async || {
        let status = get(server, "/v1/streams/gb-udp").await;
        status["status"]["state"] != "streaming"
    })
    .await;
    let status = get(server, "/v1/streams/gb-udp").await;
    tracing_free_print(&format!("while offline: {}", status["status"]));
    a.register_again.store(true, Ordering::Relaxed);
    until(
        "a fresh INVITE after the device is back",
        Duration::from_secs(15),
        async || a.plays.load(Ordering::Relaxed) > plays,
    )
    .await;
    // Events from the new play: drain what came before, then wait for people again.
    while feed.try_recv().is_ok() {}
    wait_for_classes(feed, "gb-udp", &["person"], Duration::from_secs(60)).await;
}

/// Waits for an event of `stream` stamped by the device's sender reports: on its clock,
/// 3 s behind this machine's.
async fn on_the_device_clock(feed: &mut mpsc::Receiver<Value>, stream: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let event = tokio::time::timeout_at(deadline, feed.recv())
            .await
            .unwrap_or_else(|_| panic!("{stream}: no event on the device's clock (RTCP) in 20 s"))
            .unwrap();
        if event["stream"] != stream || event["clock_source"] != "rtcp" {
            continue;
        }
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let behind = now_ms - event["capture_unix_ms"].as_i64().unwrap();
        let latency = event["latency_ms"].as_f64().unwrap() as i64;
        let expected = DEVICE_CLOCK_BEHIND.as_millis() as i64;
        // The capture was `latency` before the event; the device's clock adds its 3 s.
        assert!(
            (expected - 200..=expected + latency + 1_000).contains(&behind),
            "{stream}: capture {behind} ms before now, latency {latency} ms: {event}"
        );
        return;
    }
}

fn tracing_free_print(line: &str) {
    eprintln!("gb28181 test: {line}");
}

async fn two_tcp_channels_stay_aligned(
    server: &Server,
    sip: SocketAddr,
    frames: &Arc<Vec<rtp_pusher::PsFrame>>,
    feed: &mut mpsc::Receiver<Value>,
) {
    let channels = [CHANNELS[1].to_string(), CHANNELS[2].to_string()];
    let clean = Impairment {
        swap_every: 0,
        drop: &[],
    };
    let b = device::start(
        identity(TCP_DEVICE, channels.to_vec(), true),
        sip,
        media(frames, clean, 2),
    )
    .await;
    until("the TCP device's catalog", Duration::from_secs(10), async || {
        let d = get(server, &format!("/v1/gb28181/devices/{TCP_DEVICE}")).await;
        d["channels"].as_array().is_some_and(|c| c.len() == 2)
    })
    .await;
    assert_eq!(
        get(server, &format!("/v1/gb28181/devices/{TCP_DEVICE}")).await["transport"],
        "tcp"
    );
    for (i, c) in channels.iter().enumerate() {
        add_stream(
            server,
            &format!("gb-tcp-{i}"),
            &format!("gb28181://{TCP_DEVICE}/{c}?transport=tcp"),
        )
        .await;
    }
    until("both INVITEs", Duration::from_secs(15), async || {
        b.plays.load(Ordering::Relaxed) >= 2
    })
    .await;
    while feed.try_recv().is_ok() {}
    // Events of both streams for the same picture (same presentation time: both channels
    // start at the clip's first frame) are compared.
    let mut capture: HashMap<(String, i64), (i64, String)> = HashMap::new();
    let mut offsets = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while offsets.len() < 8 {
        let event = tokio::time::timeout_at(deadline, feed.recv())
            .await
            .unwrap_or_else(|_| panic!("only {} pictures seen on both channels", offsets.len()))
            .unwrap();
        let stream = event["stream"].as_str().unwrap().to_string();
        let Some(other) = ["gb-tcp-0", "gb-tcp-1"]
            .iter()
            .find(|s| **s != stream && stream.starts_with("gb-tcp"))
        else {
            continue;
        };
        let pts = event["pts_90k"].as_i64().unwrap();
        let at = event["capture_unix_ms"].as_i64().unwrap();
        let clock = event["clock_source"].as_str().unwrap().to_string();
        // The same picture on the other channel, stamped by the same kind of clock.
        if let Some((there, _)) = capture
            .get(&(other.to_string(), pts))
            .filter(|(_, c)| *c == clock)
        {
            offsets.push(at - there);
        }
        capture.insert((stream, pts), (at, clock));
    }
    let worst = offsets.iter().map(|o| o.abs()).max().unwrap();
    on_the_device_clock(feed, "gb-tcp-0").await;
    on_the_device_clock(feed, "gb-tcp-1").await;
    tracing_free_print(&format!(
        "capture-time offsets between two channels (ms): {offsets:?}"
    ));
    assert!(worst <= 3, "channels misaligned by up to {worst} ms: {offsets:?}");
}

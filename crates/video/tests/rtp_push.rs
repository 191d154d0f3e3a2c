//! Cameras that push (GB28181): the bikes clip muxed into MPEG-PS by GStreamer's
//! mpegpsmux, packetized into RTP by the test's pusher with packets swapped and dropped,
//! pushed over UDP, over TCP to the server's port, and over TCP the server opens; and the
//! clip as plain RTP H.264 (GStreamer's rtph264pay, over UDP) and H.265 (rtph265pay, over
//! TCP with rtpstreampay's RFC 4571 framing). The real CPU model finds people and bicycles
//! in each.

mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use peregrine_video::{ClockSource, DropReason, StreamConfig, StreamManager};
use support::engine_detector::{repo_model, EngineDetector};
use support::rtp_pusher::{mux_ps, packetize, ps_frames, push, spawn_gst_pusher, Impairment, Link};
use support::{h265_clip, local_options, shared_clip, TempDir};

/// The bikes clip's frame interval (25 fps).
const FRAME: Duration = Duration::from_millis(40);

/// Pushes the PS clip over `link` to a stream at `url` until the model has found a
/// person and a bicycle in it.
async fn detections_from_a_pushing_camera(url: String, link: Link) {
    let dir = TempDir::new("rtp-push");
    let ps = std::fs::read(mux_ps(&shared_clip("bikes.mp4"), &dir.0)).expect("muxed clip");
    let frames = ps_frames(&ps);
    assert!(frames.len() > 200, "{} frames", frames.len());
    // Swapped pairs all along, and three packets lost inside groups of pictures.
    let packets = packetize(
        &frames,
        0x6B28_1810,
        Impairment {
            swap_every: 23,
            drop: &[60, 150, 330],
        },
    );
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    expect_people_and_bicycles(url, move || {
        tokio::spawn(
            async move { push(link, &packets, FRAME, move || stopped.load(Ordering::Relaxed)).await },
        );
        Box::new(move || stop.store(true, Ordering::Relaxed))
    })
    .await;
}

/// Starts a stream at `url`, then the camera (`start` returns what stops it), and waits
/// until the model has found a person and a bicycle in the stream.
async fn expect_people_and_bicycles(url: String, start: impl FnOnce() -> Box<dyn FnOnce() + Send>) {
    let (model, runtime) = repo_model().expect("the repository's model and runtime");
    let detector = EngineDetector::start(&model, Some(&runtime), 1, 4).expect("model loads");
    let mut options = local_options(detector);
    options
        .stream_policy
        .allowed_schemes
        .extend(["rtp".into(), "rtp+tcp".into()]);
    let mut cam = StreamConfig::new("gb", url);
    cam.fps = Some(4.0);
    cam.staleness_ms = 3_000;
    cam.decode_threads = 1;
    let manager = StreamManager::start(options, vec![cam]).await.unwrap();
    let mut events = manager.subscribe("gb").await.unwrap();
    let stop = start();
    let mut found = BTreeSet::new();
    tokio::time::timeout(Duration::from_secs(45), async {
        while !(found.contains("person") && found.contains("bicycle")) {
            let e = events.recv().await.expect("event");
            assert_eq!(e.capture.source, ClockSource::RtpArrival);
            assert_eq!((e.width, e.height), (640, 272));
            for d in &e.detections {
                found.insert(e.class_names.name(d.class_id).into_owned());
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("found only {found:?} in 45 s"));
    stop();
    let c = manager.status("gb").await.unwrap().counters;
    assert_eq!(c.dropped(DropReason::DetectError), 0, "{c:?}");
    manager.shutdown().await.unwrap();
}

/// A UDP port nothing listens on now.
fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .expect("a free udp port")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mpeg_ps_over_udp_finds_people_and_bicycles() {
    let port = free_udp_port();
    let to = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    detections_from_a_pushing_camera(format!("rtp://127.0.0.1:{port}?format=ps"), Link::Udp(to)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mpeg_ps_over_tcp_to_the_server_finds_people_and_bicycles() {
    let port = support::free_port();
    let to = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    detections_from_a_pushing_camera(
        format!("rtp+tcp://127.0.0.1:{port}?format=ps"),
        Link::TcpConnect(to),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mpeg_ps_over_tcp_from_the_server_finds_people_and_bicycles() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    detections_from_a_pushing_camera(
        format!("rtp+tcp://127.0.0.1:{port}?format=ps&mode=active"),
        Link::TcpListen(listener),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_h264_from_rtph264pay_over_udp_finds_people_and_bicycles() {
    let port = free_udp_port();
    let clip = shared_clip("bikes.mp4");
    expect_people_and_bicycles(format!("rtp://127.0.0.1:{port}?format=h264"), move || {
        spawn_gst_pusher(
            &clip,
            &[
                "h264parse",
                "!",
                "rtph264pay",
                "pt=96",
                "config-interval=-1",
                "mtu=1400",
            ],
            &["udpsink", "host=127.0.0.1", &format!("port={port}")],
            port,
            true,
        )
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_h265_from_rtph265pay_over_tcp_finds_people_and_bicycles() {
    let port = support::free_port();
    let clip = h265_clip();
    expect_people_and_bicycles(format!("rtp+tcp://127.0.0.1:{port}?format=h265"), move || {
        spawn_gst_pusher(
            &clip,
            &[
                "h265parse",
                "!",
                "rtph265pay",
                "pt=96",
                "config-interval=-1",
                "mtu=1400",
            ],
            &[
                "rtpstreampay",
                "!",
                "tcpclientsink",
                "host=127.0.0.1",
                &format!("port={port}"),
            ],
            port,
            false,
        )
    })
    .await;
}

//! Streams through the manager against GStreamer's RTSP server: several cameras over TCP
//! and UDP, H.264 and H.265, events on per-stream and all-stream feeds, sampling, status,
//! a subscriber that never reads, and a camera name that turns into loopback between
//! being added and connecting.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use peregrine_video::DropReason;
use peregrine_video::RtspTransport;
use peregrine_video::{ActiveDecoder, DecoderDefaults, DecoderKind};
use peregrine_video::{
    ClockSource, HostResolver, ManagerError, ManagerOptions, ShardAssignment, SkippedStream, StreamManager,
    StreamStatus,
};
use support::{camera, h265_clip, instant_detector, local_options, shared_clip, RtspServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_cameras_deliver_sampled_events_with_rtcp_capture_times() {
    let server = RtspServer::start(&[
        ("bikes", shared_clip("bikes.mp4")),
        ("bikes265", h265_clip()),
        ("bbb", shared_clip("bigbuckbunny.mp4")),
    ]);
    let cameras = vec![
        camera("h264-tcp", server.url("bikes"), RtspTransport::Tcp, Some(5.0)),
        camera("h264-udp", server.url("bikes"), RtspTransport::Udp, Some(5.0)),
        camera("h265-tcp", server.url("bikes265"), RtspTransport::Tcp, None),
        camera("h265-udp", server.url("bikes265"), RtspTransport::Udp, Some(10.0)),
        camera("720p-tcp", server.url("bbb"), RtspTransport::Tcp, Some(5.0)),
    ];
    let detector = instant_detector();
    let manager = StreamManager::start(local_options(detector.clone()), cameras)
        .await
        .expect("start");
    let mut all = manager.subscribe_all().await.unwrap();
    let mut one = manager.subscribe("720p-tcp").await.unwrap();
    // A subscriber that never reads: it must not hold anything up.
    let _idle = manager.subscribe_all().await.unwrap();

    // Until every camera has delivered an event timed by an RTCP sender report (GStreamer
    // sends its first within about 5 s) and a few more.
    let mut per_stream: BTreeMap<String, Vec<(u64, f64, ClockSource)>> = BTreeMap::new();
    let names: BTreeSet<&str> = ["h264-tcp", "h264-udp", "h265-tcp", "h265-udp", "720p-tcp"].into();
    let done = |m: &BTreeMap<String, Vec<(u64, f64, ClockSource)>>| {
        names.iter().all(|n| {
            m.get(*n).is_some_and(|v| {
                v.len() >= 10 && v.iter().filter(|e| e.2 == ClockSource::RtcpSenderReport).count() >= 3
            })
        })
    };
    tokio::time::timeout(Duration::from_secs(60), async {
        while !done(&per_stream) {
            let e = all.recv().await.expect("feed open");
            let expected = if e.stream.starts_with("720p") {
                (1280, 720)
            } else {
                (640, 272)
            };
            assert_eq!((e.width, e.height), expected, "{}", e.stream);
            assert_eq!(e.detections.len(), 1);
            assert_eq!(e.class_names.name(0), "frame");
            assert!(e.latency < Duration::from_secs(5), "{:?}", e.latency);
            per_stream.entry(e.stream.to_string()).or_default().push((
                e.seq,
                e.pts.seconds,
                e.capture.source,
            ));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("not every camera delivered in 60 s: {:?}", per_stream.keys()));

    for (name, events) in &per_stream {
        for pair in events.windows(2) {
            assert!(pair[1].0 > pair[0].0, "{name}: seq increases");
            assert!(pair[1].1 > pair[0].1, "{name}: pts increases");
        }
    }
    let first = one.recv().await.expect("per-stream feed");
    assert_eq!(&*first.stream, "720p-tcp");

    // Sampling: 5 of 25 fps kept; every frame when no rate is set.
    for (name, expect) in [("h264-tcp", 0.2), ("h265-tcp", 1.0), ("h265-udp", 0.4)] {
        let r = manager.status(name).await.unwrap();
        assert!(
            matches!(r.status, StreamStatus::Streaming { .. }),
            "{name}: {:?}",
            r.status
        );
        let c = &r.counters;
        let handed = (c.frames_detected + c.dropped_total()) as f64;
        let ratio = handed / c.frames_decoded as f64;
        assert!(
            (ratio - expect).abs() < 0.1,
            "{name}: {ratio:.2} of decoded frames sampled: {c:?}"
        );
        assert!(c.frames_received >= c.frames_decoded.saturating_sub(5));
        assert_eq!(c.dropped(DropReason::DecodeError), 0, "{name}: {c:?}");
    }
    let list = manager.list().await.unwrap();
    assert_eq!(list.len(), 5);
    assert!(list.iter().all(|s| s.source.contains("127.0.0.1")));
    manager.shutdown().await.unwrap();
    assert!(matches!(manager.list().await, Err(ManagerError::ShutDown)));
    assert!(all.missed() < 100);
}

/// A shard starts only the configured streams it owns, says which it left to whom, and
/// refuses (naming the owner) a stream another shard owns, whether added or asked about.
#[tokio::test]
async fn a_shard_runs_only_its_own_streams() {
    let shard = ShardAssignment::new(0, 3).unwrap();
    let mut options = local_options(instant_detector());
    options.shard = shard;
    // Streams other shards own: nothing of theirs starts here.
    let theirs: Vec<String> = (0..20)
        .map(|i| format!("cam-{i}"))
        .filter(|n| !shard.owns(n))
        .take(4)
        .collect();
    let url = shared_clip("bikes.mp4").display().to_string();
    let configured = theirs
        .iter()
        .map(|n| camera(n, url.clone(), RtspTransport::Tcp, None))
        .collect();
    let manager = StreamManager::start(options, configured).await.unwrap();
    assert!(manager.list().await.unwrap().is_empty());
    let placement = manager.placement();
    assert_eq!(placement.shard, shard);
    let expected: Vec<SkippedStream> = theirs
        .iter()
        .map(|n| SkippedStream {
            name: n.clone(),
            owner: shard.owner(n),
        })
        .collect();
    assert_eq!(placement.skipped, expected);
    let (name, owner) = (&theirs[0], shard.owner(&theirs[0]));
    let refused = manager
        .add(camera(name, url.clone(), RtspTransport::Tcp, None))
        .await
        .unwrap_err();
    assert_eq!(
        refused,
        ManagerError::Misdirected {
            name: name.clone(),
            owner,
            index: 0,
            count: 3
        }
    );
    assert!(
        refused.to_string().contains(&format!("send it to shard {owner}")),
        "{refused}"
    );
    assert!(matches!(
        manager.status(name).await,
        Err(ManagerError::Misdirected { .. })
    ));
    let ours = (0..20)
        .map(|i| format!("cam-{i}"))
        .find(|n| shard.owns(n))
        .unwrap();
    assert!(matches!(
        manager.status(&ours).await,
        Err(ManagerError::NotFound(_))
    ));
}

/// Answers a list of addresses, one per question, then the last one again.
struct ChangingResolver {
    answers: Vec<IpAddr>,
    asked: AtomicUsize,
}

impl HostResolver for ChangingResolver {
    fn resolve(&self, _host: &str, _port: u16) -> BoxFuture<'static, std::io::Result<Vec<IpAddr>>> {
        let n = self.asked.fetch_add(1, Ordering::SeqCst);
        let answer = self.answers[n.min(self.answers.len() - 1)];
        Box::pin(async move { Ok(vec![answer]) })
    }
}

#[tokio::test]
async fn a_camera_whose_name_turns_to_loopback_is_refused_at_the_reconnect() {
    let mut options = ManagerOptions::new(instant_detector());
    let resolver = Arc::new(ChangingResolver {
        answers: vec!["10.255.0.1".parse().unwrap(), "127.0.0.1".parse().unwrap()],
        asked: AtomicUsize::new(0),
    });
    options.resolver = resolver.clone();
    let manager = StreamManager::start(options, Vec::new()).await.unwrap();
    let mut cam = camera(
        "rebound",
        "rtsp://cam.test:8554/x".into(),
        RtspTransport::Tcp,
        None,
    );
    cam.backoff.first_retry_ms = 600_000;
    manager
        .add(cam)
        .await
        .expect("the name resolves to a LAN address when added");
    let waited = Instant::now();
    let last_error = loop {
        match manager.status("rebound").await.unwrap().status {
            StreamStatus::BackingOff { last_error, .. } => break last_error,
            status => assert!(
                waited.elapsed() < Duration::from_secs(15),
                "never backed off: {status:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        last_error.contains("stream url refused: host cam.test resolves to 127.0.0.1, a loopback address"),
        "{last_error}"
    );
    assert_eq!(
        resolver.asked.load(Ordering::SeqCst),
        2,
        "once when added, once before connecting"
    );
    let refused = manager
        .add(camera(
            "direct",
            "rtsp://127.0.0.1:8554/x".into(),
            RtspTransport::Tcp,
            None,
        ))
        .await;
    assert!(
        matches!(refused, Err(ManagerError::Refused { .. })),
        "{refused:?}"
    );
    assert_eq!(
        manager.list().await.unwrap().len(),
        1,
        "nothing of the refused stream was started"
    );
    manager.shutdown().await.unwrap();
}

/// The decoder a stream asks for against what the machine has. Without an NVIDIA driver
/// (CI), `auto` on a server whose models run on GPU 0 decodes on the CPU and says why,
/// `nvdec` decodes nothing and says why, `cpu` just decodes; on a GPU machine the first
/// two decode on NVDEC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decoders_fall_back_to_the_cpu_with_a_reason_or_fail_saying_why() {
    let mut options = local_options(instant_detector());
    options.decoder = DecoderDefaults {
        kind: DecoderKind::Auto,
        model_gpus: vec![0],
        gpu_frames: false,
    };
    let url = shared_clip("bikes.mp4").display().to_string();
    let stream = |name: &str, decoder: Option<DecoderKind>| {
        let mut c = camera(name, url.clone(), RtspTransport::Tcp, None);
        c.looped = true;
        c.decoder = decoder;
        c
    };
    let streams = vec![
        stream("auto", None),
        stream("nvdec", Some(DecoderKind::Nvdec)),
        stream("cpu", Some(DecoderKind::Cpu)),
    ];
    let manager = StreamManager::start(options, streams).await.unwrap();
    let started = Instant::now();
    let reports = loop {
        let mut reports = BTreeMap::new();
        for name in ["auto", "nvdec", "cpu"] {
            reports.insert(name, manager.status(name).await.unwrap());
        }
        let settled = reports
            .values()
            .all(|r| r.decoder.active.is_some() || r.decoder.reason.is_some());
        let decoding = ["auto", "cpu"]
            .iter()
            .all(|n| reports[n].counters.frames_decoded > 0);
        if settled && decoding {
            break reports;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "decoders never settled: {:?}",
            reports.values().map(|r| &r.decoder).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let cpu = &reports["cpu"].decoder;
    assert_eq!(
        (cpu.requested, cpu.active, cpu.reason.as_deref()),
        (DecoderKind::Cpu, Some(ActiveDecoder::Cpu), None)
    );
    let (auto, nvdec) = (&reports["auto"].decoder, &reports["nvdec"].decoder);
    assert_eq!(
        (auto.requested, nvdec.requested),
        (DecoderKind::Auto, DecoderKind::Nvdec)
    );
    if auto.active == Some(ActiveDecoder::Nvdec) {
        eprintln!("this machine has NVDEC: both GPU streams decode there");
        assert_eq!(
            (nvdec.active, nvdec.reason.as_deref()),
            (Some(ActiveDecoder::Nvdec), None)
        );
        return;
    }
    assert_eq!(auto.active, Some(ActiveDecoder::Cpu));
    let reason = auto.reason.as_deref().unwrap_or_default();
    assert!(reason.contains("NVDEC") || reason.contains("CUDA"), "{reason}");
    assert_eq!(nvdec.active, None);
    assert_eq!(
        nvdec.reason.as_deref(),
        Some(reason),
        "both fail for the same reason"
    );
    assert_eq!(reports["nvdec"].counters.frames_decoded, 0);
}

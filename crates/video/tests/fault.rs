//! The fault test: the RTSP server dies and comes back, repeatedly. Every stream recovers by
//! itself within 5 s of the server's return, tasks and threads return to their baseline
//! and memory stays flat. Alone in its test binary, as it counts process-wide threads.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use peregrine_video::live_decode_threads;
use peregrine_video::RtspTransport;
use peregrine_video::{StreamConfig, StreamManager, StreamStatus};
use support::{eventually, h265_clip, instant_detector, local_options, rss_kb, shared_clip, RtspServer};

const STREAMS: [(&str, &str, RtspTransport); 4] = [
    ("h264-tcp", "bikes", RtspTransport::Tcp),
    ("h264-udp", "bikes", RtspTransport::Udp),
    ("h265-tcp", "bikes265", RtspTransport::Tcp),
    ("h265-udp", "bikes265", RtspTransport::Udp),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stream_recovers_within_5_s_of_the_server_returning() {
    let mut server = RtspServer::start(&[("bikes", shared_clip("bikes.mp4")), ("bikes265", h265_clip())]);
    let streams = STREAMS
        .iter()
        .map(|(name, mount, transport)| {
            let mut c = StreamConfig::new(*name, server.url(mount));
            c.transport = *transport;
            c.fps = Some(5.0);
            c.decode_threads = 1;
            c.frame_timeout_ms = 2_000;
            c.connect_timeout_ms = 3_000;
            // A camera that is back should be found again well within 5 s.
            c.backoff.initial_ms = 100;
            c.backoff.max_ms = 1_000;
            c
        })
        .collect();
    let runtime = tokio::runtime::Handle::current();
    let manager = StreamManager::start(local_options(instant_detector()), streams)
        .await
        .unwrap();
    let mut events = manager.subscribe_all().await.unwrap();

    // Latest event time per stream, fed by a task so the test can wait on conditions.
    let (seen_tx, seen) = tokio::sync::watch::channel(BTreeMap::<String, Instant>::new());
    let collector = tokio::spawn(async move {
        while let Some(e) = events.recv().await {
            seen_tx.send_modify(|m| {
                m.insert(e.stream.to_string(), Instant::now());
            });
        }
    });
    let all_since = |t: Instant| {
        let m = seen.borrow();
        STREAMS
            .iter()
            .all(|(n, _, _)| m.get(*n).is_some_and(|at| *at >= t))
    };
    let started = Instant::now();
    eventually(Duration::from_secs(30), "first events from every stream", || {
        all_since(started)
    })
    .await;

    let baseline_tasks = runtime.metrics().num_alive_tasks();
    let baseline_threads = live_decode_threads();
    let mut rss_after_cycle = Vec::new();
    for cycle in 0..4 {
        server.stop();
        // Down until every stream has noticed (its connection drops, or no frame comes for
        // 2 s) and is backing off.
        let down = Instant::now();
        for (name, _, _) in STREAMS {
            loop {
                let status = manager.status(name).await.unwrap().status;
                if matches!(status, StreamStatus::BackingOff { .. }) {
                    break;
                }
                assert!(
                    down.elapsed() < Duration::from_secs(15),
                    "cycle {cycle}: {name} is still {status:?} with the server down"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        server.restart();
        let back = Instant::now();
        eventually(Duration::from_secs(20), "every stream to deliver again", || {
            all_since(back)
        })
        .await;
        let recovery = back.elapsed();
        eprintln!(
            "cycle {cycle}: all {} streams recovered in {recovery:?}",
            STREAMS.len()
        );
        assert!(
            recovery <= Duration::from_secs(5),
            "cycle {cycle}: recovery took {recovery:?}"
        );
        for (name, _, _) in STREAMS {
            let r = manager.status(name).await.unwrap();
            assert!(r.counters.reconnects > cycle as u64, "{name}: {:?}", r.counters);
            assert!(r.frames_in_use <= r.config.frame_pool);
        }
        eventually(Duration::from_secs(15), "tasks back to the baseline", || {
            runtime.metrics().num_alive_tasks() <= baseline_tasks
        })
        .await;
        assert_eq!(
            live_decode_threads(),
            baseline_threads,
            "one decode thread per stream, always"
        );
        rss_after_cycle.push(rss_kb());
    }
    eprintln!("RSS after each cycle (kB): {rss_after_cycle:?}");
    // The first cycle warms allocator pools and reconnect paths; later cycles must not grow.
    let growth = rss_after_cycle.last().unwrap().saturating_sub(rss_after_cycle[1]);
    assert!(
        growth < 16 * 1024,
        "RSS grew {growth} kB over two cycles: {rss_after_cycle:?}"
    );

    manager.shutdown().await.unwrap();
    collector.await.unwrap();
    assert_eq!(live_decode_threads(), 0);
}

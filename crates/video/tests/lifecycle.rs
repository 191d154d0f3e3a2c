//! Streams added and removed at run time, over and over, leave no task, thread or frame
//! buffer behind, whether they were streaming or waiting to reconnect. Alone in its test
//! binary, as it counts process-wide threads.

mod support;

use std::time::{Duration, Instant};

use peregrine_video::live_decode_threads;
use peregrine_video::RtspTransport;
use peregrine_video::{ManagerError, StreamManager, StreamManagerHandle, StreamStatus};
use support::{
    camera, eventually, free_port, h265_clip, instant_detector, local_options, os_threads, shared_clip,
    RtspServer,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_come_and_go_at_run_time_without_leaking_tasks_or_threads() {
    let server = RtspServer::start(&[("bikes", shared_clip("bikes.mp4")), ("bikes265", h265_clip())]);
    let runtime = tokio::runtime::Handle::current();
    let manager = StreamManager::start(local_options(instant_detector()), Vec::new())
        .await
        .unwrap();
    let baseline_tasks = runtime.metrics().num_alive_tasks();
    let baseline_threads = live_decode_threads();
    let baseline_os_threads = os_threads();
    for cycle in 0..3 {
        let names = [format!("a{cycle}"), format!("b{cycle}"), format!("c{cycle}")];
        manager
            .add(camera(
                &names[0],
                server.url("bikes"),
                RtspTransport::Tcp,
                Some(5.0),
            ))
            .await
            .unwrap();
        manager
            .add(camera(
                &names[1],
                server.url("bikes265"),
                RtspTransport::Udp,
                Some(5.0),
            ))
            .await
            .unwrap();
        let mut c = camera(
            &names[2],
            shared_clip("bikes.mp4").display().to_string(),
            RtspTransport::Tcp,
            None,
        );
        c.looped = true;
        manager.add(c).await.unwrap();
        assert!(matches!(
            manager
                .add(camera(&names[0], server.url("bikes"), RtspTransport::Tcp, None))
                .await,
            Err(ManagerError::Duplicate(_))
        ));
        for name in &names {
            let mut sub = manager.subscribe(name).await.unwrap();
            tokio::time::timeout(Duration::from_secs(30), sub.recv())
                .await
                .unwrap_or_else(|_| panic!("{name}: no event in 30 s"))
                .expect("event");
        }
        assert_eq!(live_decode_threads(), baseline_threads + 3);
        for name in &names {
            manager.remove(name).await.unwrap();
        }
        assert!(matches!(
            manager.remove(&names[0]).await,
            Err(ManagerError::NotFound(_))
        ));
        assert!(manager.list().await.unwrap().is_empty());
        // `remove` answers after the stream's tasks and thread have ended; only retina's
        // background TEARDOWN of the UDP session may still be finishing.
        assert_eq!(live_decode_threads(), baseline_threads, "decode threads ended");
        eventually(Duration::from_secs(15), "tasks back to the baseline", || {
            runtime.metrics().num_alive_tasks() <= baseline_tasks
        })
        .await;
    }
    remove_while_backing_off(&manager).await;
    assert_eq!(live_decode_threads(), baseline_threads, "decode threads ended");
    eventually(Duration::from_secs(15), "OS threads back to the baseline", || {
        os_threads() <= baseline_os_threads + 2
    })
    .await;
    manager.shutdown().await.unwrap();
}

/// A camera that refuses, with a backoff far longer than the test: removing it interrupts
/// the wait instead of sitting it out.
async fn remove_while_backing_off(manager: &StreamManagerHandle) {
    let url = format!("rtsp://127.0.0.1:{}/nothing", free_port());
    let mut c = camera("refused", url, RtspTransport::Tcp, None);
    c.backoff.first_retry_ms = 600_000;
    c.backoff.initial_ms = 600_000;
    c.backoff.max_ms = 600_000;
    manager.add(c).await.unwrap();
    let waited = Instant::now();
    loop {
        let status = manager.status("refused").await.unwrap().status;
        if let StreamStatus::BackingOff { last_error, .. } = &status {
            assert!(last_error.contains("127.0.0.1"), "{last_error}");
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(15),
            "never backed off: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let removing = Instant::now();
    tokio::time::timeout(Duration::from_secs(15), manager.remove("refused"))
        .await
        .expect("remove answers without waiting for the backoff")
        .unwrap();
    eprintln!("removed while backing off in {:?}", removing.elapsed());
    assert!(matches!(
        manager.status("refused").await,
        Err(ManagerError::NotFound(_))
    ));
    assert!(manager.list().await.unwrap().is_empty());
}

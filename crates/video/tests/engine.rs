//! The real CPU detector (peregrine_engine's synchronous pipeline on its own thread, behind
//! the FrameDetector trait) on a live RTSP camera: people and bicycles are found in the
//! bikes clip, boxes lie inside the frame, and nothing is dropped as an error.

mod support;

use std::time::Duration;

use peregrine_video::DropReason;
use peregrine_video::{StreamConfig, StreamManager};
use support::engine_detector::{repo_model, EngineDetector};
use support::{local_options, shared_clip, RtspServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cpu_model_finds_people_and_bicycles_on_a_live_camera() {
    let (model, runtime) = repo_model().expect("the repository's model and runtime");
    let detector = EngineDetector::start(&model, Some(&runtime), 1, 4).expect("model loads");
    let server = RtspServer::start(&[("bikes", shared_clip("bikes.mp4"))]);
    let mut cam = StreamConfig::new("bikes", server.url("bikes"));
    cam.fps = Some(2.0);
    cam.staleness_ms = 3_000;
    let manager = StreamManager::start(local_options(detector), vec![cam])
        .await
        .unwrap();
    let mut events = manager.subscribe("bikes").await.unwrap();
    let mut found = std::collections::BTreeSet::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        while !(found.contains("person") && found.contains("bicycle")) {
            let e = events.recv().await.expect("event");
            for d in &e.detections {
                assert!(d.bbox.x1 >= 0.0 && d.bbox.x2 <= e.width as f32 && d.bbox.y2 <= e.height as f32);
                assert!(d.score > 0.25);
                found.insert(e.class_names.name(d.class_id).into_owned());
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("found only {found:?} in 60 s"));
    let c = manager.status("bikes").await.unwrap().counters;
    assert_eq!(c.dropped(DropReason::DetectError), 0, "{c:?}");
    manager.shutdown().await.unwrap();
}

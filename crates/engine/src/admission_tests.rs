//! Admission under a burst: requests that passed the early check count as ahead of later
//! ones while they read their bodies.

use super::*;
use crate::admission::{Stage, EARLY_HEADROOM, QUEUEING_HEADROOM};
use crate::wait::Ahead;

/// One instance, batches of one, 40 ms a batch, shedding on.
fn shedding_engine() -> Engine {
    let computed = Arc::new(Mutex::new(Vec::new()));
    let factory = move |_instance: usize| -> Result<Detector, EngineError> {
        let backend = SlowBackend::new(Duration::from_millis(40), computed.clone());
        let config = DetectorConfig {
            imgsz: None,
            max_batch: 1,
            run_sizes: vec![],
        };
        Detector::new(Box::new(backend), &config)
    };
    Engine::start(fake_config(1, 1, true), factory).unwrap()
}

/// Ready, and the batch costs the warm-up measured published to the request path (the queue
/// task publishes them just after readiness): until then every estimate is zero.
async fn ready_and_seeded(engine: &Engine) {
    ready(engine).await;
    until("the warm-up's batch costs are published", || {
        engine.shared.wait.load().batch_cost(1).is_some()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_judged_as_a_queue_not_as_many_first_requests() {
    let engine = shedding_engine();
    ready_and_seeded(&engine).await;
    // Twenty requests arrive together with 300 ms each; none has read its body yet.
    let deadline = Instant::now() + Duration::from_millis(300);
    let permits: Vec<AdmissionPermit> = (0..20).map(|_| engine.try_admit().unwrap()).collect();
    let admitted = permits
        .iter()
        .filter(|p| engine.check_admission(p, deadline).is_ok())
        .count();
    // At 40 ms a batch (and the warm-up's spread), a few fit in 300 ms, not twenty.
    assert!((1..=7).contains(&admitted), "{admitted} of 20 admitted");
    let refused = engine.check_admission(&permits[19], deadline);
    assert!(
        matches!(refused, Err(RequestError::Backlogged { .. })),
        "{refused:?}"
    );
    // Once they have gone (answered, or refused later), nothing is counted ahead.
    drop(permits);
    assert_eq!(engine.shared.admitted.load(Ordering::Relaxed), 0);
    let p = engine.try_admit().unwrap();
    engine.check_admission(&p, far()).unwrap();
    // Reaching the decoder hands the request over to the decoding count.
    let answer = engine.detect(&p, png(7), DetectParams::default(), far()).await;
    assert_eq!(answer.unwrap().detections[0].class_id, 7);
    assert_eq!(engine.shared.admitted.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promise_made_before_decoding_keeps_a_wider_margin_than_the_last_check() {
    let engine = shedding_engine();
    ready_and_seeded(&engine).await;
    // Three images queued ahead: an estimate of four batches of 40 ms or so.
    let ahead = Ahead {
        decoding: 0,
        queued: 3,
    };
    let estimate = engine.shared.wait.load().estimate(ahead, false, Instant::now());
    assert!(estimate >= Duration::from_millis(100), "{estimate:?}");
    // A deadline between the two margins: too close to promise before decoding, close
    // enough to keep a request that has already been decoded.
    let between = (EARLY_HEADROOM + QUEUEING_HEADROOM) / 2.0;
    let deadline = Instant::now() + estimate.mul_f64(between);
    for stage in [Stage::Admission, Stage::BeforeDecode] {
        let refused = engine.check_backlog(deadline, ahead, false, stage);
        assert!(
            matches!(refused, Err(RequestError::Backlogged { .. })),
            "{stage:?}: {refused:?}"
        );
    }
    engine
        .check_backlog(deadline, ahead, false, Stage::AfterDecode)
        .unwrap();
}

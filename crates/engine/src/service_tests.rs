//! Engine tests over a fake backend: batching, deadlines, admission, shutdown.

use super::*;
use crate::fake::{broken_jpeg, jpeg, png, DeviceJpegBackend, SlowBackend};
use crate::DetectorConfig;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

fn start(
    delay_ms: u64,
    max_batch: usize,
    capacity: usize,
    in_flight: usize,
) -> (Engine, Arc<Mutex<Vec<u8>>>) {
    start_with(delay_ms, max_batch, capacity, in_flight, None, false)
}

fn start_with(
    delay_ms: u64,
    max_batch: usize,
    capacity: usize,
    in_flight: usize,
    objective: Option<Objective>,
    has_fallback: bool,
) -> (Engine, Arc<Mutex<Vec<u8>>>) {
    let computed = Arc::new(Mutex::new(Vec::new()));
    let c = computed.clone();
    let factory = move |_instance: usize| -> Result<Detector, EngineError> {
        let backend = SlowBackend::new(Duration::from_millis(delay_ms), c.clone());
        Detector::new(
            Box::new(backend),
            &DetectorConfig {
                imgsz: None,
                max_batch,
                run_sizes: vec![],
            },
        )
    };
    let config = EngineConfig {
        name: "fake".into(),
        version: "1".into(),
        instances: 1,
        policy: BatchPolicy {
            max_batch,
            max_delay: Duration::from_millis(5),
            preferred: vec![],
            capacity,
        },
        max_in_flight: in_flight,
        preprocess_threads: 2,
        decode_limits: DecodeLimits::default(),
        jpeg_dct_scaling: false,
        shed_on_backlog: false,
        defaults: DetectParams::default(),
        objective,
        has_fallback,
    };
    (Engine::start(config, factory).unwrap(), computed)
}

async fn ready(engine: &Engine) {
    engine.wait_ready().await.unwrap();
}

/// Polls the engine's own state until `holds` (at most 5 s): the signal a test waits for
/// instead of sleeping for a guessed time.
async fn until(what: &str, holds: impl Fn() -> bool) {
    let started = Instant::now();
    while !holds() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn running(engine: &Engine) -> usize {
    engine.shared.running.load(Ordering::Relaxed)
}

fn queued(engine: &Engine) -> usize {
    engine.shared.queued.load(Ordering::Relaxed)
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_are_batched_and_answered_in_order() {
    let (engine, computed) = start(50, 4, 16, 16);
    ready(&engine).await;
    let tasks = spawn_detects(&engine, 1..=4);
    let mut sizes = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        let r = t.await.unwrap().unwrap();
        assert_eq!(
            r.detections[0].class_id,
            i as u32 + 1,
            "each request gets its own image's answer"
        );
        assert_eq!((r.width, r.height), (32, 32));
        sizes.push(r.timings.batch_size);
    }
    assert!(
        sizes.iter().any(|&s| s > 1),
        "some requests shared a batch: {sizes:?}"
    );
    assert_eq!(computed.lock().unwrap().len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_and_abandoned_requests_are_never_computed() {
    let (engine, computed) = start(150, 1, 16, 16);
    ready(&engine).await;
    let busy = {
        let e = engine.clone();
        tokio::spawn(async move {
            let p = e.try_admit().unwrap();
            e.detect(&p, png(1), DetectParams::default(), far()).await
        })
    };
    until("the busy request runs", || running(&engine) == 1).await;
    // Deadline inside the busy batch: answered 504-style, never computed.
    let p = engine.try_admit().unwrap();
    let soon = Instant::now() + Duration::from_millis(40);
    let err = engine
        .detect(&p, png(2), DetectParams::default(), soon)
        .await
        .unwrap_err();
    assert_eq!(err, RequestError::DeadlineExceeded { stage: "queued" });
    until("the expired request left the queue", || queued(&engine) == 0).await;
    // A caller that gives up (its future dropped) is removed before batching.
    let e = engine.clone();
    let abandoned = tokio::spawn(async move {
        let p = e.try_admit().unwrap();
        e.detect(&p, png(3), DetectParams::default(), far()).await
    });
    until("the abandoned request is queued", || queued(&engine) == 1).await;
    assert_eq!(running(&engine), 1, "still behind the busy batch");
    abandoned.abort();
    busy.await.unwrap().unwrap();
    // A later request still runs, after the dropped ones were swept.
    let p = engine.try_admit().unwrap();
    engine
        .detect(&p, png(4), DetectParams::default(), far())
        .await
        .unwrap();
    assert_eq!(*computed.lock().unwrap(), [1, 4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_and_queue_capacity_refuse_at_once() {
    let (engine, _) = start(200, 1, 1, 2);
    ready(&engine).await;
    let a = engine.try_admit().unwrap();
    let _b = engine.try_admit().unwrap();
    assert_eq!(
        engine.try_admit().unwrap_err(),
        RequestError::Overloaded { limit: 2 }
    );
    drop(a);
    assert_eq!(engine.in_flight(), 1);
    // One running, one queued, the third finds the queue full.
    let mut tasks = Vec::new();
    let (engine2, _) = start(200, 1, 1, 8);
    ready(&engine2).await;
    for red in 1..=3u8 {
        let e = engine2.clone();
        tasks.push(tokio::spawn(async move {
            let p = e.try_admit().unwrap();
            e.detect(&p, png(red), DetectParams::default(), far()).await
        }));
        match red {
            1 => until("the first request runs", || running(&engine2) == 1).await,
            2 => until("the second request is queued", || queued(&engine2) == 1).await,
            _ => {}
        }
    }
    let outcomes: Vec<_> = join_tasks(tasks).await;
    assert!(outcomes[0].is_ok() && outcomes[1].is_ok(), "{outcomes:?}");
    assert!(
        matches!(outcomes[2], Err(RequestError::QueueFull { capacity: 1, .. })),
        "{outcomes:?}"
    );
}

/// One detection task per colour, each with its own permit, all sent at once.
fn spawn_detects(
    engine: &Engine,
    reds: impl IntoIterator<Item = u8>,
) -> Vec<tokio::task::JoinHandle<Result<ImageResult, RequestError>>> {
    reds.into_iter()
        .map(|red| {
            let e = engine.clone();
            tokio::spawn(async move {
                let permit = e.try_admit().unwrap();
                e.detect(&permit, png(red), DetectParams::default(), far()).await
            })
        })
        .collect()
}

async fn join_tasks(
    tasks: Vec<tokio::task::JoinHandle<Result<ImageResult, RequestError>>>,
) -> Vec<Result<ImageResult, RequestError>> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_images_are_refused_before_the_queue() {
    let (engine, computed) = start(1, 1, 4, 4);
    ready(&engine).await;
    let p = engine.try_admit().unwrap();
    let err = engine
        .detect(
            &p,
            Bytes::from_static(b"not an image"),
            DetectParams::default(),
            far(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, RequestError::BadImage(_)));
    assert!(computed.lock().unwrap().is_empty());
}

/// One image's tensor for the fake model: every value of the red plane is `red / 255`.
fn tensor(red: u8) -> Bytes {
    let plane = 32 * 32;
    let mut values = vec![0f32; 3 * plane];
    values[..plane].fill(f32::from(red) / 255.0);
    Bytes::from(values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tensors_and_images_share_batches_and_get_their_own_outputs() {
    let (engine, computed) = start(50, 4, 16, 16);
    ready(&engine).await;
    let e = engine.clone();
    let image = tokio::spawn(async move {
        let p = e.try_admit().unwrap();
        e.detect(&p, png(7), DetectParams::default(), far()).await
    });
    let p = engine.try_admit().unwrap();
    let raw = engine.infer_tensor(&p, tensor(9), far()).await.unwrap();
    assert_eq!(
        raw.data,
        [1.0, 1.0, 5.0, 5.0, 0.9, 9.0],
        "the raw row, unprocessed"
    );
    let dets = image.await.unwrap().unwrap();
    assert_eq!(dets.detections[0].class_id, 7);
    let mut seen = computed.lock().unwrap().clone();
    seen.sort_unstable();
    assert_eq!(seen, [7, 9]);
    let stats = engine.stats();
    assert_eq!(stats.success.count, 2);
    assert_eq!(stats.inference_count, 2, "warm-up is not counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tensor_of_the_wrong_size_is_refused_unrun() {
    let (engine, computed) = start(1, 1, 4, 4);
    ready(&engine).await;
    let p = engine.try_admit().unwrap();
    let err = engine
        .infer_tensor(&p, Bytes::from_static(&[0; 12]), far())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RequestError::BadTensor(m) if m.contains("12288 bytes (3x32x32 float32); got 12")),
        "{err}"
    );
    assert!(computed.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_stops_once_its_last_handle_and_request_are_gone() {
    let (engine, _) = start(100, 1, 4, 4);
    ready(&engine).await;
    let weak = engine.downgrade();
    // A request in flight keeps the engine alive after the owner lets go of it.
    let e = engine.clone();
    let pending = tokio::spawn(async move {
        let p = e.try_admit().unwrap();
        e.detect(&p, png(5), DetectParams::default(), far()).await
    });
    until("the request runs", || running(&engine) == 1).await;
    drop(engine);
    let answered = pending.await.unwrap().unwrap();
    assert_eq!(
        answered.detections[0].class_id, 5,
        "the request finished on its engine"
    );
    let started = Instant::now();
    while !weak.is_stopped() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the engine did not stop"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breached_objective_lowers_the_batch_limit_and_latency_is_windowed() {
    // Every batch takes 10 ms, so no request can meet a 1 ms objective: the controller
    // must halve the limit (8 -> 4) once 20 answers are in the window.
    let objective = Objective {
        p99: Duration::from_millis(1),
        window: Duration::from_secs(1),
        adaptive_batching: true,
    };
    let (engine, _) = start_with(10, 8, 64, 64, Some(objective), false);
    ready(&engine).await;
    assert_eq!(engine.batch_limit(), 8);
    let tasks = spawn_detects(&engine, 0..24);
    assert!(join_tasks(tasks).await.iter().all(Result::is_ok));
    let window = engine.latency();
    assert_eq!((window.answered, window.failed), (24, 0));
    assert!(window.p99 >= Duration::from_millis(10), "{window:?}");
    until("the limit is halved", || engine.batch_limit() == 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_model_with_a_fallback_judges_whether_to_divert() {
    // One image a batch at 30 ms against a 10 ms objective: every wait is past it.
    let objective = Objective {
        p99: Duration::from_millis(10),
        window: Duration::from_secs(1),
        adaptive_batching: false,
    };
    for has_fallback in [true, false] {
        let (engine, _) = start_with(30, 1, 16, 16, Some(objective.clone()), has_fallback);
        ready(&engine).await;
        let (run, p99) = engine
            .run_past_objective()
            .expect("one run is past the objective");
        assert!(
            run >= Duration::from_millis(30) && p99 == objective.p99,
            "{run:?}"
        );
        let tasks = spawn_detects(&engine, 0..4);
        if has_fallback {
            until("the model diverts", || engine.diverting()).await;
        }
        assert!(join_tasks(tasks).await.iter().all(Result::is_ok));
        // Even idle, the next request would wait 30 ms: a model with a fallback keeps
        // diverting; one without never asked.
        assert_eq!(engine.diverting(), has_fallback);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_warm_up_is_reported_with_its_reason() {
    let factory = move |_instance: usize| -> Result<Detector, EngineError> {
        let mut backend = SlowBackend::new(Duration::ZERO, Arc::default());
        backend.fail = Some("out of memory".into());
        Detector::new(Box::new(backend), &DetectorConfig::default())
    };
    let config = EngineConfig {
        name: "broken".into(),
        version: "3".into(),
        instances: 2,
        policy: BatchPolicy {
            max_batch: 1,
            max_delay: Duration::ZERO,
            preferred: vec![],
            capacity: 4,
        },
        max_in_flight: 4,
        preprocess_threads: 1,
        decode_limits: DecodeLimits::default(),
        jpeg_dct_scaling: false,
        shed_on_backlog: false,
        defaults: DetectParams::default(),
        objective: None,
        has_fallback: false,
    };
    let engine = Engine::start(config, factory).unwrap();
    let err = engine.wait_ready().await.unwrap_err();
    assert!(err.to_string().contains("out of memory"), "{err}");
    assert!(!engine.is_ready());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decoded_frames_with_padded_rows_are_detected_and_bad_ones_refused() {
    let (engine, computed) = start(1, 4, 4, 4);
    ready(&engine).await;
    // 32x32 RGB with rows padded to 128 bytes, as a video decoder lays them out.
    let stride = 128;
    let mut frame = vec![0u8; stride * 32];
    for row in frame.chunks_mut(stride) {
        for px in row[..96].chunks_mut(3) {
            px[0] = 11;
        }
    }
    let p = engine.try_admit().unwrap();
    let r = engine
        .detect_frame(&p, frame, 32, 32, stride, DetectParams::default(), far())
        .await
        .unwrap();
    assert_eq!((r.width, r.height, r.detections[0].class_id), (32, 32, 11));
    let err = engine
        .detect_frame(&p, vec![0u8; 10], 32, 32, 96, DetectParams::default(), far())
        .await
        .unwrap_err();
    assert!(matches!(err, RequestError::BadImage(_)), "{err}");
    assert_eq!(*computed.lock().unwrap(), [11]);
}

fn start_device_jpeg(device_fails: bool) -> (Engine, Arc<Mutex<usize>>) {
    let decoded = Arc::new(Mutex::new(0));
    let d = decoded.clone();
    let factory = move |_instance: usize| -> Result<Detector, EngineError> {
        Detector::new(
            Box::new(DeviceJpegBackend::new(device_fails, d.clone())),
            &DetectorConfig {
                imgsz: None,
                max_batch: 4,
                run_sizes: vec![],
            },
        )
    };
    let config = EngineConfig {
        name: "fake-jpeg".into(),
        version: "1".into(),
        instances: 1,
        policy: BatchPolicy {
            max_batch: 4,
            max_delay: Duration::from_millis(5),
            preferred: vec![],
            capacity: 16,
        },
        max_in_flight: 16,
        preprocess_threads: 1,
        decode_limits: DecodeLimits::default(),
        jpeg_dct_scaling: false,
        shed_on_backlog: false,
        defaults: DetectParams::default(),
        objective: None,
        has_fallback: false,
    };
    (Engine::start(config, factory).unwrap(), decoded)
}

async fn class_of(engine: &Engine, image: Bytes) -> Result<(u32, u32, u32), RequestError> {
    let permit = engine.try_admit().unwrap();
    let r = engine
        .detect(&permit, image, DetectParams::default(), far())
        .await?;
    Ok((r.detections[0].class_id, r.width, r.height))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baseline_jpegs_go_to_the_device_decoder_and_other_images_to_the_cpu() {
    let (engine, decoded) = start_device_jpeg(false);
    engine.wait_ready().await.unwrap();
    let warm_up = *decoded.lock().unwrap();
    assert!(warm_up > 0, "warm-up runs the device decoder");
    let (class, w, h) = class_of(&engine, jpeg(200)).await.unwrap();
    assert!(
        class.abs_diff(200) <= 4,
        "the JPEG's own colour came through: {class}"
    );
    assert_eq!((w, h), (64, 48), "sizes are the JPEG's, from its header");
    assert_eq!(*decoded.lock().unwrap(), warm_up + 1);
    let (class, _, _) = class_of(&engine, png(77)).await.unwrap();
    assert_eq!(class, 77, "a PNG is decoded on the CPU and still answered");
    assert_eq!(*decoded.lock().unwrap(), warm_up + 1, "not by the device");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_device_cannot_decode_a_batch_its_jpegs_are_decoded_on_the_cpu() {
    let (engine, _) = start_device_jpeg(true);
    // Warm-up's test JPEG also falls back, and still passes.
    engine.wait_ready().await.unwrap();
    let good = {
        let e = engine.clone();
        tokio::spawn(async move { class_of(&e, jpeg(150)).await })
    };
    let bad = {
        let e = engine.clone();
        tokio::spawn(async move { class_of(&e, broken_jpeg()).await })
    };
    let (class, _, _) = good.await.unwrap().unwrap();
    assert!(class.abs_diff(150) <= 4, "{class}");
    match bad.await.unwrap() {
        Err(RequestError::BadImage(e)) => assert!(e.to_string().contains("corrupt"), "{e}"),
        other => panic!("the broken JPEG must fail on its own: {other:?}"),
    }
}

/// An engine configuration for the fake model: `instances`, batches up to `max_batch`
/// with no waiting for company, room for 64 requests, shedding as `shed` says.
fn fake_config(instances: usize, max_batch: usize, shed: bool) -> EngineConfig {
    EngineConfig {
        name: "fake".into(),
        version: "1".into(),
        instances,
        policy: BatchPolicy {
            max_batch,
            max_delay: Duration::ZERO,
            preferred: vec![],
            capacity: 64,
        },
        max_in_flight: 64,
        preprocess_threads: 1,
        shed_on_backlog: shed,
        ..EngineConfig::default()
    }
}

#[path = "device_loss_tests.rs"]
mod device_loss;

#[path = "admission_tests.rs"]
mod admission;

#[path = "device_frame_tests.rs"]
mod device_frame;

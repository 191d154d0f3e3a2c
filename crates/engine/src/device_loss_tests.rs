//! A GPU that fails: its instances leave the rotation, the batch it was running goes to
//! the instances left, and with none left every request is refused at once.

use std::sync::atomic::AtomicBool;

use super::*;

/// The red values the fake model computed (see `SlowBackend`).
type Computed = Arc<Mutex<Vec<u8>>>;
/// Per fake GPU: set, and its runs fail as a corrupt CUDA context's do.
type Breakers = [Arc<AtomicBool>; 2];

/// Four instances over two fake GPUs (0, 1, 0, 1, as placement spreads them); each GPU
/// breaks when its flag is set.
fn two_gpus() -> (Engine, Computed, Breakers) {
    let computed = Arc::new(Mutex::new(Vec::new()));
    let flags = [Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false))];
    let (c, f) = (computed.clone(), flags.clone());
    let factory = move |instance: usize| -> Result<Detector, EngineError> {
        let mut backend = SlowBackend::new(Duration::from_millis(5), c.clone());
        let device = instance % 2;
        backend.device = Some(device as i32);
        backend.broken = Some(f[device].clone());
        let config = DetectorConfig {
            imgsz: None,
            max_batch: 2,
            run_sizes: vec![],
        };
        Detector::new(Box::new(backend), &config)
    };
    (
        Engine::start(fake_config(4, 2, false), factory).unwrap(),
        computed,
        flags,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_gpu_leaves_the_rotation_and_loses_no_request() {
    let (engine, computed, [_, gpu1]) = two_gpus();
    ready(&engine).await;
    let devices: Vec<_> = engine.placement().iter().map(|p| p.device).collect();
    assert_eq!(devices, [Some(0), Some(1), Some(0), Some(1)]);
    gpu1.store(true, Ordering::Relaxed);
    let answers = join_tasks(spawn_detects(&engine, 1..=40)).await;
    for (red, answer) in (1..=40u32).zip(answers) {
        let result = answer.unwrap_or_else(|e| panic!("request {red} failed: {e}"));
        assert_eq!(result.detections[0].class_id, red, "its own image's answer");
    }
    let placement = engine.placement();
    for (i, p) in placement.iter().enumerate() {
        let on_gpu1 = p.device == Some(1);
        assert_eq!(p.retired.is_some(), on_gpu1, "instance {i}: {p:?}");
    }
    let reason = placement[1].retired.as_deref().unwrap();
    assert!(
        reason.contains("GPU 1 failed") && reason.contains("illegal memory access"),
        "{reason}"
    );
    assert!(engine.is_ready(), "GPU 0 still serves");
    let mut reds = computed.lock().unwrap().clone();
    reds.sort_unstable();
    reds.dedup();
    assert_eq!(reds.len(), 40, "every request computed on GPU 0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_gpu_failed_requests_are_refused_at_once() {
    let (engine, _, [gpu0, gpu1]) = two_gpus();
    ready(&engine).await;
    gpu0.store(true, Ordering::Relaxed);
    gpu1.store(true, Ordering::Relaxed);
    for answer in join_tasks(spawn_detects(&engine, 1..=8)).await {
        assert!(
            matches!(answer, Err(RequestError::NoInstances { .. })),
            "{answer:?}"
        );
    }
    until("no instance is left", || !engine.is_ready()).await;
    let permit = engine.try_admit().unwrap();
    let refused = engine.check_admission(&permit, far()).unwrap_err();
    assert!(matches!(refused, RequestError::NoInstances { .. }), "{refused}");
    assert!(refused.to_string().contains("has no instance left"), "{refused}");
    assert!(engine.placement().iter().all(|p| p.retired.is_some()));
}

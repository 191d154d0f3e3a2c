//! The running engine for one model: admission, the preprocessing pool, the batch queue
//! (owned by one task) and the model instances (each on its own OS thread).
//!
//! ```text
//!  request ──admit──▶ decode + letterbox ──▶ queue task ──idle instance asks──▶ instance thread
//!  (permit, or 429)   (blocking pool,         (BatchQueue:                      (Detector::run_prepared,
//!                      bounded)               batch, expire, drop)              replies per image)
//! ```

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_queue::ArrayQueue;
use peregrine_types::DetectParams;
use peregrine_vision::{decode_image, DecodeLimits, DetectorSpec, ImageView, Letterbox, LetterboxCanvas};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use crate::detector::{Detector, PreparedInput};
use crate::queue::{BatchPolicy, BatchQueue, Dropped, NextBatch, QueueItem};
use crate::request::{ImageResult, RequestError, RequestTimings};
use crate::{telemetry, EngineError};

/// How an engine runs one model.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Name clients use for the model.
    pub name: String,
    /// Version reported with every result.
    pub version: String,
    /// Model instances (sessions), each on its own thread.
    pub instances: usize,
    pub policy: BatchPolicy,
    /// Requests admitted at once (decoding, queued or running); more get 429.
    pub max_in_flight: usize,
    /// Images decoded and letterboxed at once.
    pub preprocess_threads: usize,
    pub decode_limits: DecodeLimits,
    /// Refuse (429) a request whose deadline is shorter than the work already queued,
    /// instead of queueing it to time out (504).
    pub shed_on_backlog: bool,
}

/// Builds one model instance; called once per instance at start.
pub type DetectorFactory = dyn Fn() -> Result<Detector, EngineError> + Send + Sync;

/// A request's claim on capacity. Keep it until the response is sent.
#[derive(Debug)]
pub struct AdmissionPermit {
    _permit: OwnedSemaphorePermit,
    engine: Arc<Shared>,
}

impl Drop for AdmissionPermit {
    fn drop(&mut self) {
        let n = self.engine.in_flight.fetch_sub(1, Ordering::Relaxed) - 1;
        telemetry::in_flight(&self.engine.config.name, n);
    }
}

struct Entry {
    canvas: Vec<u8>,
    letterbox: Letterbox,
    params: DetectParams,
    deadline: Instant,
    decode: Duration,
    reply: oneshot::Sender<Result<ImageResult, RequestError>>,
}

impl QueueItem for Entry {
    fn deadline(&self) -> Instant {
        self.deadline
    }
    fn is_abandoned(&self) -> bool {
        self.reply.is_closed()
    }
}

type Batch = Vec<(Entry, Duration)>;

enum Command {
    Enqueue(Entry),
    /// An instance is idle and waits on this sender for its next batch.
    Idle(oneshot::Sender<Batch>),
}

#[derive(Debug)]
struct Shared {
    config: EngineConfig,
    spec: DetectorSpec,
    admission: Arc<Semaphore>,
    in_flight: AtomicUsize,
    preprocess: Semaphore,
    ready_instances: AtomicUsize,
    failed: AtomicBool,
    buffers: ArrayQueue<Vec<u8>>,
    /// Images waiting in the batch queue, as the queue task last saw it.
    queued: AtomicUsize,
    /// Recent time of one full batch, in nanoseconds (moving average; 0 until measured).
    ns_per_batch: std::sync::atomic::AtomicU64,
    /// Batches running on the instances right now.
    running: AtomicUsize,
}

impl Shared {
    /// Returns a canvas to the pool; when the pool is full the buffer is simply freed.
    fn recycle(&self, canvas: Vec<u8>) {
        let _ = self.buffers.push(canvas);
    }

    /// How long a request arriving now would wait for its result: the batches queued
    /// ahead of it (counted as full ones) plus those running, shared among the instances.
    /// Nothing queued and nothing running means no wait, whatever past batches cost, so a
    /// slow spell can never lock the engine into refusing everything.
    fn expected_wait(&self) -> Duration {
        let queued = self.queued.load(Ordering::Relaxed);
        let running = self.running.load(Ordering::Relaxed);
        let batches = queued.div_ceil(self.config.policy.max_batch.max(1)) + running;
        let per_batch = self.ns_per_batch.load(Ordering::Relaxed);
        Duration::from_nanos(per_batch.saturating_mul(batches as u64) / self.config.instances.max(1) as u64)
    }

    /// Folds a full-size batch's time into the moving average (smaller batches say little
    /// about the cost of the full ones that a backlog is made of).
    fn record_batch_time(&self, batch: Duration, images: usize) {
        if images < self.config.policy.max_batch {
            return;
        }
        let sample = u64::try_from(batch.as_nanos()).unwrap_or(u64::MAX);
        let old = self.ns_per_batch.load(Ordering::Relaxed);
        // A short moving average: follows the machine's speed within a few batches.
        let new = if old == 0 { sample } else { (old * 7 + sample) / 8 };
        self.ns_per_batch.store(new, Ordering::Relaxed);
    }
}

/// A cloneable handle to a running engine. Dropping every handle stops it: the queue task
/// ends, then the instance threads.
#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
    commands: mpsc::Sender<Command>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("model", &self.shared.config.name)
            .finish()
    }
}

thread_local! {
    static SCRATCH: RefCell<LetterboxCanvas> = RefCell::new(LetterboxCanvas::new());
}

impl Engine {
    /// Builds every instance (so a bad model fails here), then starts the queue task and
    /// the instance threads, which warm up before the engine reports ready. Must be called
    /// inside a tokio runtime.
    pub fn start(config: EngineConfig, factory: &DetectorFactory) -> Result<Self, EngineError> {
        let instances = config.instances.max(1);
        let detectors: Vec<Detector> = (0..instances).map(|_| factory()).collect::<Result<_, _>>()?;
        let spec = detectors[0].spec().clone();
        let mut policy = config.policy.clone();
        policy.max_batch = policy.max_batch.clamp(1, detectors[0].batch_size());
        let pool_size = policy.capacity + instances * policy.max_batch + config.preprocess_threads + 1;
        let shared = Arc::new(Shared {
            admission: Arc::new(Semaphore::new(config.max_in_flight.max(1))),
            in_flight: AtomicUsize::new(0),
            preprocess: Semaphore::new(config.preprocess_threads.max(1)),
            ready_instances: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            buffers: ArrayQueue::new(pool_size),
            queued: AtomicUsize::new(0),
            ns_per_batch: std::sync::atomic::AtomicU64::new(0),
            running: AtomicUsize::new(0),
            spec,
            config: EngineConfig {
                policy: policy.clone(),
                ..config
            },
        });
        // Commands are small and the queue task drains them at once; the bound only stops a
        // stalled task from growing memory.
        let (tx, rx) = mpsc::channel(policy.capacity + 64);
        tokio::spawn(run_queue(rx, policy.clone(), shared.clone()));
        for (i, detector) in detectors.into_iter().enumerate() {
            let (tx, shared, sizes) = (tx.clone(), shared.clone(), policy.batch_sizes());
            std::thread::Builder::new()
                .name(format!("model-{}-{i}", shared.config.name))
                .spawn(move || run_instance(detector, tx, shared, sizes))
                .map_err(|e| EngineError::Thread(e.to_string()))?;
        }
        Ok(Self { shared, commands: tx })
    }

    pub fn name(&self) -> &str {
        &self.shared.config.name
    }

    pub fn version(&self) -> &str {
        &self.shared.config.version
    }

    pub fn spec(&self) -> &DetectorSpec {
        &self.shared.spec
    }

    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    /// True once every instance has loaded and run each batch size once.
    pub fn is_ready(&self) -> bool {
        !self.shared.failed.load(Ordering::Relaxed)
            && self.shared.ready_instances.load(Ordering::Acquire) >= self.shared.config.instances.max(1)
    }

    /// Requests currently admitted.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// Takes a slot for one request, or says at once that there is none.
    pub fn try_admit(&self) -> Result<AdmissionPermit, RequestError> {
        let permit =
            self.shared
                .admission
                .clone()
                .try_acquire_owned()
                .map_err(|_| RequestError::Overloaded {
                    limit: self.shared.config.max_in_flight,
                })?;
        let n = self.shared.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        telemetry::in_flight(&self.shared.config.name, n);
        Ok(AdmissionPermit {
            _permit: permit,
            engine: self.shared.clone(),
        })
    }

    /// Decodes, queues and detects one image. Nothing is decoded or computed for a request
    /// whose deadline has passed; a request abandoned by its caller (this future dropped)
    /// is removed from the queue before its batch is formed.
    pub async fn detect(
        &self,
        _permit: &AdmissionPermit,
        image: Bytes,
        params: DetectParams,
        deadline: Instant,
    ) -> Result<ImageResult, RequestError> {
        let outcome = self.detect_inner(image, params, deadline).await;
        if let Err(RequestError::DeadlineExceeded { stage }) = &outcome {
            telemetry::deadline_exceeded(&self.shared.config.name, stage);
        }
        outcome
    }

    async fn detect_inner(
        &self,
        image: Bytes,
        params: DetectParams,
        deadline: Instant,
    ) -> Result<ImageResult, RequestError> {
        if !self.is_ready() {
            return Err(RequestError::NotReady {
                model: self.shared.config.name.clone(),
            });
        }
        // Refuse now, with a 429 the client can act on, rather than decode and queue a
        // request that will certainly miss its deadline and end as a 504.
        let expected = self.shared.expected_wait();
        let budget = deadline.saturating_duration_since(Instant::now());
        if self.shared.config.shed_on_backlog && expected > budget {
            return Err(RequestError::Backlogged {
                expected_ms: expected.as_millis() as u64,
                budget_ms: budget.as_millis() as u64,
            });
        }
        let tokio_deadline = tokio::time::Instant::from_std(deadline);
        let expired = |stage| RequestError::DeadlineExceeded { stage };
        let slot = tokio::time::timeout_at(tokio_deadline, self.shared.preprocess.acquire())
            .await
            .map_err(|_| expired("waiting for a decoder"))?
            .map_err(|_| RequestError::ShuttingDown)?;
        if Instant::now() >= deadline {
            return Err(expired("waiting for a decoder"));
        }
        let shared = self.shared.clone();
        let started = Instant::now();
        let (canvas, letterbox, width, height) =
            tokio::task::spawn_blocking(move || prepare(&shared, &image))
                .await
                .map_err(|e| RequestError::Inference(format!("the decoder task failed: {e}")))??;
        drop(slot);
        if Instant::now() >= deadline {
            self.shared.recycle(canvas);
            return Err(expired("decoding"));
        }
        let (reply, answer) = oneshot::channel();
        let entry = Entry {
            canvas,
            letterbox,
            params,
            deadline,
            decode: started.elapsed(),
            reply,
        };
        self.commands
            .send(Command::Enqueue(entry))
            .await
            .map_err(|_| RequestError::ShuttingDown)?;
        let mut result = tokio::time::timeout_at(tokio_deadline, answer)
            .await
            .map_err(|_| expired("queued"))?
            .map_err(|_| RequestError::ShuttingDown)??;
        result.width = width;
        result.height = height;
        Ok(result)
    }
}

/// Decode and letterbox on the blocking pool, into a pooled canvas.
fn prepare(shared: &Shared, image: &[u8]) -> Result<(Vec<u8>, Letterbox, u32, u32), RequestError> {
    let decoded = decode_image(image, shared.config.decode_limits)?;
    let mut canvas = shared.buffers.pop().unwrap_or_default();
    let letterbox = SCRATCH.with(|s| {
        Detector::prepare(
            &shared.spec,
            ImageView::from(&decoded.rgb),
            &mut s.borrow_mut(),
            &mut canvas,
        )
    });
    Ok((canvas, letterbox, decoded.width(), decoded.height()))
}

/// The queue task: sole owner of the [`BatchQueue`].
async fn run_queue(mut commands: mpsc::Receiver<Command>, policy: BatchPolicy, shared: Arc<Shared>) {
    let model = shared.config.name.clone();
    let capacity = policy.capacity;
    let mut queue: BatchQueue<Entry> = BatchQueue::new(policy);
    let mut idle: Vec<oneshot::Sender<Batch>> = Vec::new();
    let mut wake: Option<Instant> = None;
    loop {
        let command = match wake {
            Some(at) => tokio::select! {
                c = commands.recv() => match c { Some(c) => Some(c), None => break },
                _ = tokio::time::sleep_until(tokio::time::Instant::from_std(at)) => None,
            },
            None => match commands.recv().await {
                Some(c) => Some(c),
                None => break,
            },
        };
        let now = Instant::now();
        match command {
            Some(Command::Enqueue(entry)) => {
                if let Err(entry) = queue.push(entry, now) {
                    let _ = entry.reply.send(Err(RequestError::QueueFull {
                        model: model.clone(),
                        capacity,
                    }));
                    shared.recycle(entry.canvas);
                }
            }
            Some(Command::Idle(instance)) => idle.push(instance),
            None => {}
        }
        let mut dropped = Dropped::default();
        wake = None;
        loop {
            idle.retain(|i| !i.is_closed());
            let Some(instance) = idle.pop() else {
                queue.sweep(now, &mut dropped);
                wake = queue.earliest_deadline();
                break;
            };
            match queue.next_batch(now, &mut dropped) {
                NextBatch::Run(batch) => {
                    for (_, waited) in &batch {
                        telemetry::queued(&model, *waited);
                    }
                    if let Err(batch) = instance.send(batch) {
                        for (entry, _) in batch {
                            let _ = entry
                                .reply
                                .send(Err(RequestError::Inference("the model instance stopped".into())));
                        }
                    }
                }
                NextBatch::WaitUntil(at) => {
                    idle.push(instance);
                    wake = Some(queue.earliest_deadline().map_or(at, |d| d.min(at)));
                    break;
                }
                NextBatch::Empty => {
                    idle.push(instance);
                    break;
                }
            }
        }
        telemetry::dropped(&model, "expired", dropped.expired.len());
        telemetry::dropped(&model, "abandoned", dropped.abandoned.len());
        for entry in dropped.expired.into_iter().chain(dropped.abandoned) {
            let _ = entry
                .reply
                .send(Err(RequestError::DeadlineExceeded { stage: "queued" }));
            shared.recycle(entry.canvas);
        }
        shared.queued.store(queue.len(), Ordering::Relaxed);
        telemetry::queue_depth(&model, queue.len());
    }
    for entry in queue.drain_all() {
        let _ = entry.reply.send(Err(RequestError::ShuttingDown));
    }
}

/// One model instance's thread: warm up, then run whatever batch the queue hands over.
fn run_instance(
    mut detector: Detector,
    commands: mpsc::Sender<Command>,
    shared: Arc<Shared>,
    sizes: Vec<usize>,
) {
    let model = shared.config.name.clone();
    if let Err(e) = warm_up(&mut detector, &shared.spec, &sizes) {
        tracing::error!(model = %model, error = %e, "warm-up failed; the model will not become ready");
        shared.failed.store(true, Ordering::Relaxed);
        return;
    }
    shared.ready_instances.fetch_add(1, Ordering::Release);
    tracing::info!(model = %model, batch_sizes = ?sizes, "model instance warmed up");
    loop {
        let (tx, rx) = oneshot::channel();
        if commands.blocking_send(Command::Idle(tx)).is_err() {
            break;
        }
        let Ok(batch) = rx.blocking_recv() else { break };
        let inputs: Vec<PreparedInput<'_>> = batch
            .iter()
            .map(|(e, _)| PreparedInput {
                canvas: &e.canvas,
                letterbox: &e.letterbox,
                params: &e.params,
            })
            .collect();
        shared.running.fetch_add(1, Ordering::Relaxed);
        let outcome = detector.run_prepared(&inputs);
        shared.running.fetch_sub(1, Ordering::Relaxed);
        drop(inputs);
        let size = batch.len();
        match outcome {
            Ok((detections, t)) => {
                telemetry::batch_ran(&model, size, t.preprocess, t.inference, t.postprocess);
                shared.record_batch_time(t.total(), size);
                for ((entry, waited), detections) in batch.into_iter().zip(detections) {
                    let timings = RequestTimings {
                        decode: entry.decode,
                        queue: waited,
                        inference: t.total(),
                        batch_size: size,
                    };
                    let _ = entry.reply.send(Ok(ImageResult {
                        width: 0,
                        height: 0,
                        detections,
                        timings,
                    }));
                    shared.recycle(entry.canvas);
                }
            }
            Err(e) => {
                tracing::error!(model = %model, error = %e, batch = size, "inference failed");
                for (entry, _) in batch {
                    let _ = entry.reply.send(Err(RequestError::Inference(e.to_string())));
                    shared.recycle(entry.canvas);
                }
            }
        }
    }
}

/// Runs each batch size once on gray images so the first real request pays no warm-up.
fn warm_up(detector: &mut Detector, spec: &DetectorSpec, sizes: &[usize]) -> Result<(), EngineError> {
    let canvas = vec![Letterbox::PAD_VALUE; spec.image_len()];
    let letterbox = Letterbox::new(
        spec.input_width,
        spec.input_height,
        spec.input_width,
        spec.input_height,
    );
    let params = DetectParams::default();
    for &n in sizes {
        let inputs = vec![
            PreparedInput {
                canvas: &canvas,
                letterbox: &letterbox,
                params: &params,
            };
            n
        ];
        detector.run_prepared(&inputs)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use peregrine_backend::{Backend, BackendError, InputBatch, ModelDescription, OutputBuffer};
    use peregrine_types::model::ElementType;
    use peregrine_types::{Dim, TensorDescription};
    use std::sync::Mutex;

    /// An end-to-end model of 32x32 inputs that sleeps per batch and counts the images it
    /// computed (warm-up excluded: it counts only non-gray images).
    struct SlowBackend {
        description: ModelDescription,
        delay: Duration,
        computed: Arc<Mutex<Vec<u8>>>,
    }

    impl Backend for SlowBackend {
        fn description(&self) -> &ModelDescription {
            &self.description
        }
        fn run(&mut self, input: InputBatch<'_>, output: &mut OutputBuffer) -> Result<(), BackendError> {
            std::thread::sleep(self.delay);
            let n = input.shape[0];
            let plane = 32 * 32;
            output.shape = vec![n, 1, 6];
            output.data.clear();
            for i in 0..n {
                // The image's colour (first pixel of the red plane) identifies the request.
                let red = (input.data[i * 3 * plane] * 255.0).round() as u8;
                if red != Letterbox::PAD_VALUE {
                    self.computed.lock().unwrap().push(red);
                }
                output
                    .data
                    .extend_from_slice(&[1.0, 1.0, 5.0, 5.0, 0.9, f32::from(red)]);
            }
            Ok(())
        }
    }

    fn start(
        delay_ms: u64,
        max_batch: usize,
        capacity: usize,
        in_flight: usize,
    ) -> (Engine, Arc<Mutex<Vec<u8>>>) {
        let computed = Arc::new(Mutex::new(Vec::new()));
        let c = computed.clone();
        let factory = move || -> Result<Detector, EngineError> {
            let t = |name: &str, dims| TensorDescription {
                name: name.into(),
                element: ElementType::F32,
                dims,
            };
            let backend = SlowBackend {
                description: ModelDescription {
                    inputs: vec![t(
                        "images",
                        vec![Dim::Dynamic, Dim::Fixed(3), Dim::Fixed(32), Dim::Fixed(32)],
                    )],
                    outputs: vec![t("output0", vec![Dim::Dynamic, Dim::Fixed(1), Dim::Fixed(6)])],
                    metadata: [("end2end".to_string(), "True".to_string())].into(),
                },
                delay: Duration::from_millis(delay_ms),
                computed: c.clone(),
            };
            Detector::new(
                Box::new(backend),
                &crate::DetectorConfig {
                    imgsz: None,
                    max_batch,
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
            shed_on_backlog: false,
        };
        (Engine::start(config, &factory).unwrap(), computed)
    }

    fn png(red: u8) -> Bytes {
        let img = image::RgbImage::from_pixel(32, 32, image::Rgb([red, 0, 0]));
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, image::ImageFormat::Png).unwrap();
        Bytes::from(out.into_inner())
    }

    async fn ready(engine: &Engine) {
        while !engine.is_ready() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_requests_are_batched_and_answered_in_order() {
        let (engine, computed) = start(50, 4, 16, 16);
        ready(&engine).await;
        let tasks: Vec<_> = (1..=4u8)
            .map(|red| {
                let e = engine.clone();
                tokio::spawn(async move {
                    let permit = e.try_admit().unwrap();
                    e.detect(&permit, png(red), DetectParams::default(), far()).await
                })
            })
            .collect();
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
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Deadline inside the busy batch: answered 504-style, never computed.
        let p = engine.try_admit().unwrap();
        let soon = Instant::now() + Duration::from_millis(40);
        let err = engine
            .detect(&p, png(2), DetectParams::default(), soon)
            .await
            .unwrap_err();
        assert_eq!(err, RequestError::DeadlineExceeded { stage: "queued" });
        // A caller that gives up (its future dropped) is removed before batching.
        let e = engine.clone();
        let abandoned = tokio::spawn(async move {
            let p = e.try_admit().unwrap();
            e.detect(&p, png(3), DetectParams::default(), far()).await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
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
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        let outcomes: Vec<_> = join_tasks(tasks).await;
        assert!(outcomes[0].is_ok() && outcomes[1].is_ok(), "{outcomes:?}");
        assert!(
            matches!(outcomes[2], Err(RequestError::QueueFull { capacity: 1, .. })),
            "{outcomes:?}"
        );
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
}

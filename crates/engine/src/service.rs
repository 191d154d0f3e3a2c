//! The running engine for one model version: admission, the preprocessing pool, the batch
//! queue (owned by one task, see `queue_task`) and the model instances (each on its own OS
//! thread, see `instance`).
//!
//! ```text
//!  request ──admit──▶ decode + letterbox ──▶ queue task ──idle instance asks──▶ instance thread
//!  (permit, or 429)   (blocking pool,         (BatchQueue:                      (Detector::run_batch,
//!                      bounded)               batch, expire, drop)              replies per slot)
//! ```
//!
//! An engine stops by itself once nothing refers to it: the registry drops its handle when
//! a version is retired, requests in flight keep theirs until they are answered, then the
//! queue task ends and the instance threads free their sessions.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_queue::ArrayQueue;
use peregrine_backend::ModelDescription;
use peregrine_types::DetectParams;
use peregrine_vision::{
    baseline_jpeg, decode_image_with, BaselineJpeg, DecodeLimits, DecodeOptions, DetectorSpec, ImageView,
    InputForm, Letterbox, LetterboxCanvas,
};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};

use crate::detector::{Detector, ItemOutput};
use crate::queue::BatchPolicy;
use crate::queue_task::{run_queue, Command, Entry, ItemTimings, Work};
use crate::request::{ImageResult, RequestError, RequestTimings, TensorResult};
use crate::stats::{EngineStats, StatsSnapshot};
use crate::{instance, telemetry, EngineError};

/// How an engine runs one model version.
#[derive(Debug, Clone, PartialEq)]
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
    /// Let JPEGs over twice the model's input size decode at 1/2, 1/4 or 1/8 scale
    /// (libjpeg-turbo's scaled IDCT) before the letterbox: much less decoding work, pixels
    /// a little different from a full-size decode (see `DecodeOptions::fit_within`).
    pub jpeg_dct_scaling: bool,
    /// Refuse (429) a request whose deadline is shorter than the work already queued,
    /// instead of queueing it to time out (504).
    pub shed_on_backlog: bool,
    /// Thresholds for requests that set none.
    pub defaults: DetectParams,
}

impl Default for EngineConfig {
    /// What a model gets unless the server's flags or its own config say otherwise.
    fn default() -> Self {
        Self {
            name: String::new(),
            version: String::new(),
            instances: 1,
            policy: BatchPolicy {
                max_batch: 4,
                max_delay: Duration::ZERO,
                preferred: Vec::new(),
                capacity: 64,
            },
            max_in_flight: 128,
            preprocess_threads: 2,
            decode_limits: DecodeLimits::default(),
            jpeg_dct_scaling: false,
            shed_on_backlog: true,
            defaults: DetectParams::default(),
        }
    }
}

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

/// How far the instances have got with warming up.
#[derive(Debug, Clone, Default)]
struct Readiness {
    ready: usize,
    failed: Option<String>,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub config: EngineConfig,
    pub spec: DetectorSpec,
    description: ModelDescription,
    admission: Arc<Semaphore>,
    in_flight: AtomicUsize,
    preprocess: Semaphore,
    readiness: watch::Sender<Readiness>,
    buffers: ArrayQueue<Vec<u8>>,
    /// Images waiting in the batch queue, as the queue task last saw it.
    pub queued: AtomicUsize,
    /// Recent time of one full batch, in nanoseconds (moving average; 0 until measured).
    ns_per_batch: AtomicU64,
    /// Batches running on the instances right now.
    pub running: AtomicUsize,
    pub stats: EngineStats,
    /// One image's raw output shape (without the batch dimension), known after warm-up.
    pub output_shape: std::sync::OnceLock<Vec<usize>>,
    /// The instances decode baseline JPEGs on the device: such requests skip the CPU.
    pub device_jpeg: bool,
}

impl Shared {
    /// Returns a canvas to the pool; when the pool is full the buffer is simply freed.
    pub fn recycle(&self, canvas: Vec<u8>) {
        let _ = self.buffers.push(canvas);
    }

    pub fn instance_ready(&self) {
        self.readiness.send_modify(|r| r.ready += 1);
    }

    pub fn instance_failed(&self, why: String) {
        self.readiness.send_modify(|r| {
            r.failed.get_or_insert(why);
        });
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
    pub fn record_batch_time(&self, batch: Duration, images: usize) {
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
            .field("version", &self.shared.config.version)
            .finish()
    }
}

/// Watches an engine without keeping it alive.
#[derive(Debug, Clone)]
pub struct WeakEngine(Weak<Shared>);

impl WeakEngine {
    /// True once the engine's queue task and instance threads have ended and their
    /// sessions are freed.
    pub fn is_stopped(&self) -> bool {
        self.0.strong_count() == 0
    }
}

thread_local! {
    static SCRATCH: RefCell<LetterboxCanvas> = RefCell::new(LetterboxCanvas::new());
    /// The last decoded image's pixel memory, for the next image this thread decodes.
    static DECODED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Largest decode buffer a thread keeps between images (a 4K frame is 24 MiB); the memory
/// of a rare larger image is given back at once.
const KEEP_DECODE_BUFFER_BYTES: usize = 32 << 20;

fn keep_decode_buffer(buffer: Vec<u8>) {
    if buffer.capacity() <= KEEP_DECODE_BUFFER_BYTES {
        DECODED.with(|b| *b.borrow_mut() = buffer);
    }
}

impl Engine {
    /// Builds every instance (so a bad model fails here), then starts the queue task and
    /// the instance threads, which warm up before the engine reports ready. Must be called
    /// inside a tokio runtime.
    pub fn start(
        config: EngineConfig,
        factory: impl Fn() -> Result<Detector, EngineError>,
    ) -> Result<Self, EngineError> {
        let instances = config.instances.max(1);
        let detectors: Vec<Detector> = (0..instances).map(|_| factory()).collect::<Result<_, _>>()?;
        let spec = detectors[0].spec().clone();
        let device_jpeg = detectors.iter().all(Detector::decodes_jpeg);
        let description = detectors[0].description().clone();
        let mut policy = config.policy.clone();
        policy.max_batch = policy.max_batch.clamp(1, detectors[0].batch_size());
        let pool_size = policy.capacity + instances * policy.max_batch + config.preprocess_threads + 1;
        let shared = Arc::new(Shared {
            admission: Arc::new(Semaphore::new(config.max_in_flight.max(1))),
            in_flight: AtomicUsize::new(0),
            preprocess: Semaphore::new(config.preprocess_threads.max(1)),
            readiness: watch::Sender::new(Readiness::default()),
            buffers: ArrayQueue::new(pool_size),
            queued: AtomicUsize::new(0),
            ns_per_batch: AtomicU64::new(0),
            running: AtomicUsize::new(0),
            stats: EngineStats::new(policy.max_batch),
            output_shape: std::sync::OnceLock::new(),
            device_jpeg,
            spec,
            description,
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
            let (weak, shared) = (tx.downgrade(), shared.clone());
            std::thread::Builder::new()
                .name(format!("model-{}-{i}", shared.config.name))
                .spawn(move || instance::run_instance(detector, weak, shared))
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

    /// The model's own tensors and metadata.
    pub fn description(&self) -> &ModelDescription {
        &self.shared.description
    }

    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    /// One image's raw model output shape, without the batch dimension; known once an
    /// instance has warmed up.
    pub fn output_shape(&self) -> Option<&[usize]> {
        self.shared.output_shape.get().map(Vec::as_slice)
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats.snapshot()
    }

    pub fn downgrade(&self) -> WeakEngine {
        WeakEngine(Arc::downgrade(&self.shared))
    }

    /// True once every instance has loaded and run each batch size once.
    pub fn is_ready(&self) -> bool {
        let r = self.shared.readiness.borrow();
        r.failed.is_none() && r.ready >= self.shared.config.instances.max(1)
    }

    /// Waits until every instance has warmed up, or says why one could not.
    pub async fn wait_ready(&self) -> Result<(), EngineError> {
        let want = self.shared.config.instances.max(1);
        let mut rx = self.shared.readiness.subscribe();
        let r = rx
            .wait_for(|r| r.failed.is_some() || r.ready >= want)
            .await
            .map_err(|_| EngineError::WarmUp("the engine stopped while warming up".into()))?;
        match &r.failed {
            Some(why) => Err(EngineError::WarmUp(why.clone())),
            None => Ok(()),
        }
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
        let started = Instant::now();
        let outcome = self.detect_inner(image, params, deadline).await;
        self.finish(started, &outcome);
        outcome
    }

    /// Runs one image's worth of the caller's own input tensor (`[3, height, width]`
    /// float32, little-endian, already normalised) and returns the model's raw output for
    /// it. It is batched with images and other tensors like any request.
    pub async fn infer_tensor(
        &self,
        _permit: &AdmissionPermit,
        data: Bytes,
        deadline: Instant,
    ) -> Result<TensorResult, RequestError> {
        let started = Instant::now();
        let outcome = self.infer_tensor_inner(data, deadline).await;
        self.finish(started, &outcome);
        outcome
    }

    fn finish<T>(&self, started: Instant, outcome: &Result<T, RequestError>) {
        self.shared.stats.finished(outcome.is_ok(), started.elapsed());
        if let Err(RequestError::DeadlineExceeded { stage }) = outcome {
            telemetry::deadline_exceeded(&self.shared.config.name, stage);
        }
    }

    /// Refuses a request the engine cannot serve in time, before any work is spent on it.
    fn check_admissible(&self, deadline: Instant) -> Result<(), RequestError> {
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
        Ok(())
    }

    /// Detects objects in a frame already decoded (a video frame: packed RGB8 rows of
    /// `stride` bytes). Letterboxing runs on the preprocessing pool, after which `frame` is
    /// dropped (a pooled buffer goes back to its pool before the model runs). Batched with
    /// every other request to this engine.
    #[allow(clippy::too_many_arguments)]
    pub async fn detect_frame<F>(
        &self,
        _permit: &AdmissionPermit,
        frame: F,
        width: usize,
        height: usize,
        stride: usize,
        params: DetectParams,
        deadline: Instant,
    ) -> Result<ImageResult, RequestError>
    where
        F: AsRef<[u8]> + Send + 'static,
    {
        let started = Instant::now();
        let outcome = self
            .preprocess_and_detect(
                move |shared| {
                    let view = ImageView {
                        data: frame.as_ref(),
                        width,
                        height,
                        stride,
                    };
                    if width == 0
                        || height == 0
                        || stride < width * 3
                        || view.data.len() < stride * (height - 1) + width * 3
                    {
                        return Err(RequestError::BadImage(peregrine_vision::DecodeError::Empty));
                    }
                    Ok(letterbox_into_pool(shared, view, (view.width, view.height)))
                },
                params,
                deadline,
            )
            .await;
        self.finish(started, &outcome);
        outcome
    }

    async fn detect_inner(
        &self,
        image: Bytes,
        params: DetectParams,
        deadline: Instant,
    ) -> Result<ImageResult, RequestError> {
        if self.shared.device_jpeg {
            // A header read, microseconds: no decoder slot needed.
            if let Some(jpeg) = baseline_jpeg(&image, self.shared.config.decode_limits)? {
                return self.detect_device_jpeg(image, jpeg, params, deadline).await;
            }
        }
        self.preprocess_and_detect(move |shared| prepare(shared, &image), params, deadline)
            .await
    }

    /// Queues a baseline JPEG as it is, for the instance to decode on the device.
    async fn detect_device_jpeg(
        &self,
        image: Bytes,
        jpeg: BaselineJpeg,
        params: DetectParams,
        deadline: Instant,
    ) -> Result<ImageResult, RequestError> {
        self.check_admissible(deadline)?;
        let spec = &self.shared.spec;
        let (width, height) = (jpeg.width as usize, jpeg.height as usize);
        let letterbox = Letterbox::new(width, height, spec.input_width, spec.input_height);
        let work = Work::Jpeg {
            data: image,
            width,
            height,
            letterbox,
            params,
        };
        self.submit_image(work, deadline, Duration::ZERO, (jpeg.width, jpeg.height))
            .await
    }

    /// Runs `prepare` (decode and letterbox) on the bounded preprocessing pool, then queues
    /// the canvas and waits for its detections; nothing is done past the deadline.
    async fn preprocess_and_detect(
        &self,
        prepare: impl FnOnce(&Shared) -> Result<(Vec<u8>, Letterbox, u32, u32), RequestError> + Send + 'static,
        params: DetectParams,
        deadline: Instant,
    ) -> Result<ImageResult, RequestError> {
        self.check_admissible(deadline)?;
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
        let (canvas, letterbox, width, height) = tokio::task::spawn_blocking(move || prepare(&shared))
            .await
            .map_err(|e| RequestError::Inference(format!("the decoder task failed: {e}")))??;
        drop(slot);
        let decode = started.elapsed();
        if Instant::now() >= deadline {
            self.shared.recycle(canvas);
            return Err(expired("decoding"));
        }
        let work = Work::Image {
            canvas,
            letterbox,
            params,
        };
        self.submit_image(work, deadline, decode, (width, height)).await
    }

    /// Queues an image slot and waits for its detections; `size` is the picture's, which
    /// the result reports.
    async fn submit_image(
        &self,
        work: Work,
        deadline: Instant,
        decode: Duration,
        (width, height): (u32, u32),
    ) -> Result<ImageResult, RequestError> {
        let (output, t) = self.submit(work, deadline, decode).await?;
        let detections = match output {
            ItemOutput::Detections(d) => d,
            ItemOutput::Rejected(e) => return Err(RequestError::BadImage(e)),
            ItemOutput::Tensor(_) => {
                return Err(RequestError::Inference("an image slot returned a tensor".into()))
            }
        };
        Ok(ImageResult {
            width,
            height,
            detections,
            timings: RequestTimings {
                decode,
                queue: t.queue,
                inference: t.batch,
                batch_size: t.batch_size,
            },
        })
    }

    async fn infer_tensor_inner(&self, data: Bytes, deadline: Instant) -> Result<TensorResult, RequestError> {
        let spec = &self.shared.spec;
        let want = spec.image_len() * spec.input_form.element_size();
        if data.len() != want {
            let (h, w) = (spec.input_height, spec.input_width);
            let layout = match spec.input_form {
                InputForm::PlanarF32 => format!("3x{h}x{w} float32"),
                InputForm::InterleavedU8 => format!("{h}x{w}x3 uint8"),
            };
            return Err(RequestError::BadTensor(format!(
                "one image of the input is {want} bytes ({layout}); got {}",
                data.len()
            )));
        }
        self.check_admissible(deadline)?;
        let (output, t) = self.submit(Work::Tensor(data), deadline, Duration::ZERO).await?;
        let ItemOutput::Tensor(data) = output else {
            return Err(RequestError::Inference(
                "a tensor slot returned detections".into(),
            ));
        };
        Ok(TensorResult {
            data,
            timings: RequestTimings {
                decode: Duration::ZERO,
                queue: t.queue,
                inference: t.batch,
                batch_size: t.batch_size,
            },
        })
    }

    /// Queues one slot and waits for its answer, at most until `deadline`.
    async fn submit(
        &self,
        work: Work,
        deadline: Instant,
        decode: Duration,
    ) -> Result<(ItemOutput, ItemTimings), RequestError> {
        let (reply, answer) = oneshot::channel();
        let entry = Entry {
            work,
            deadline,
            decode,
            reply,
        };
        self.commands
            .send(Command::Enqueue(entry))
            .await
            .map_err(|_| RequestError::ShuttingDown)?;
        tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), answer)
            .await
            .map_err(|_| RequestError::DeadlineExceeded { stage: "queued" })?
            .map_err(|_| RequestError::ShuttingDown)?
    }
}

/// Decode and letterbox on the blocking pool, into a pooled canvas. The decoded pixels go
/// into this thread's own buffer, reused from image to image.
fn prepare(shared: &Shared, image: &[u8]) -> Result<(Vec<u8>, Letterbox, u32, u32), RequestError> {
    let spec = &shared.spec;
    let mut options = DecodeOptions {
        buffer: DECODED.with(|b| std::mem::take(&mut *b.borrow_mut())),
        fit_within: shared
            .config
            .jpeg_dct_scaling
            .then_some((spec.input_width, spec.input_height)),
    };
    let decoded = decode_image_with(image, shared.config.decode_limits, &mut options);
    // On an error the buffer is still in `options`; on success it is the image's.
    let decoded = match decoded {
        Ok(d) => d,
        Err(e) => {
            keep_decode_buffer(options.buffer);
            return Err(e.into());
        }
    };
    let size = (decoded.width() as usize, decoded.height() as usize);
    let prepared = letterbox_into_pool(shared, ImageView::from(&decoded.rgb), size);
    keep_decode_buffer(decoded.rgb.into_raw());
    Ok(prepared)
}

/// Letterboxes `image` (a picture of `size`, possibly held at reduced scale) into a pooled
/// canvas, with this thread's scratch.
fn letterbox_into_pool(
    shared: &Shared,
    image: ImageView<'_>,
    size: (usize, usize),
) -> (Vec<u8>, Letterbox, u32, u32) {
    let mut canvas = shared.buffers.pop().unwrap_or_default();
    let spec = &shared.spec;
    let letterbox = SCRATCH.with(|s| {
        s.borrow_mut()
            .fill_into_from(image, size, spec.input_width, spec.input_height, &mut canvas)
    });
    (canvas, letterbox, size.0 as u32, size.1 as u32)
}

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;

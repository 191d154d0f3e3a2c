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

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use peregrine_backend::ModelDescription;
use peregrine_types::DetectParams;
use peregrine_vision::{
    baseline_jpeg, BaselineJpeg, DecodeLimits, DetectorSpec, ImageView, InputForm, Letterbox,
};
use tokio::sync::{mpsc, oneshot};

use crate::adaptive::Objective;
pub use crate::admission::AdmissionPermit;
use crate::admission::Stage;
use crate::detector::Detector;
use crate::preprocess::{letterbox_into_pool, prepare, Prepared};
use crate::queue::BatchPolicy;
use crate::queue_task::{run_queue, Command, Entry, ItemTimings};
use crate::request::{ImageResult, RequestError, RequestTimings, TensorResult};
use crate::rotation::InstancePlacement;
use crate::shared::{Decoding, Shared};
use crate::slot::{Slot, SlotOutput};
use crate::stats::StatsSnapshot;
use crate::wait::Ahead;
use crate::window::WindowStats;
use crate::{instance, spans, telemetry, EngineError};

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
    /// Refuse (429) a request whose estimated answer (see [`crate::wait`]) comes after its
    /// deadline, at admission and again after decoding, instead of queueing it to time out
    /// (504).
    pub shed_on_backlog: bool,
    /// Thresholds for requests that set none.
    pub defaults: DetectParams,
    /// The latency objective and the loops it drives; without one, latency is still
    /// measured (over 10 s) and exported.
    pub objective: Option<Objective>,
    /// The model names a fallback that may serve its requests: only then does the queue
    /// task judge, after every dispatch, whether to divert them (`crate::divert`). The
    /// registry sets it from the model's `fallback` for each version it loads.
    pub has_fallback: bool,
}

impl EngineConfig {
    /// The window latency is measured over: the objective's, or 10 s without one.
    pub fn latency_window(&self) -> Duration {
        self.objective
            .as_ref()
            .map_or(crate::adaptive::DEFAULT_WINDOW, |o| o.window)
    }
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
            objective: None,
            has_fallback: false,
        }
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

impl Engine {
    /// Builds every instance (so a bad model fails here), `factory(i)` building instance
    /// `i` (on the device placement gives it), then starts the queue task and the instance
    /// threads, which warm up before the engine reports ready. Must be called inside a
    /// tokio runtime.
    pub fn start(
        config: EngineConfig,
        factory: impl Fn(usize) -> Result<Detector, EngineError>,
    ) -> Result<Self, EngineError> {
        let instances = config.instances.max(1);
        let detectors: Vec<Detector> = (0..instances).map(&factory).collect::<Result<_, _>>()?;
        let devices: Vec<Option<i32>> = detectors.iter().map(Detector::device).collect();
        let spec = detectors[0].spec().clone();
        let device_jpeg = detectors.iter().all(Detector::decodes_jpeg);
        // Frames on a GPU only where every instance can take them: a frame goes to
        // whichever instance is free.
        let frames_device = detectors[0]
            .frames_device()
            .filter(|&d| detectors.iter().all(|x| x.frames_device() == Some(d)));
        let description = detectors[0].description().clone();
        let mut policy = config.policy.clone();
        policy.max_batch = policy.max_batch.clamp(1, detectors[0].batch_size());
        let config = EngineConfig {
            policy: policy.clone(),
            ..config
        };
        let shared = Arc::new(Shared::new(
            config,
            spec,
            description,
            device_jpeg,
            frames_device,
            &devices,
        ));
        // Commands are small and the queue task drains them at once; the bound only stops a
        // stalled task from growing memory.
        let (tx, rx) = mpsc::channel(policy.capacity + 64);
        tokio::spawn(run_queue(rx, policy.clone(), shared.clone()));
        for (i, detector) in detectors.into_iter().enumerate() {
            let (weak, shared) = (tx.downgrade(), shared.clone());
            std::thread::Builder::new()
                .name(format!("model-{}-{i}", shared.config.name))
                .spawn(move || instance::run_instance(i, detector, weak, shared))
                .map_err(|e| EngineError::Thread(e.to_string()))?;
        }
        Ok(Self { shared, commands: tx })
    }

    pub fn name(&self) -> &str {
        &self.shared.config.name
    }

    /// What the engine's tasks and threads share, for its other modules (admission).
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
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

    /// True once every instance has loaded and run each batch size once, and until no
    /// instance is left in rotation.
    pub fn is_ready(&self) -> bool {
        let r = self.shared.readiness.borrow();
        r.failed.is_none()
            && r.ready >= self.shared.config.instances.max(1)
            && self.shared.no_instances.get().is_none()
    }

    /// Each instance's device and, once its device failed, why it is out of rotation.
    pub fn placement(&self) -> Arc<Vec<InstancePlacement>> {
        self.shared.placement.load_full()
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

    /// Decodes, queues and detects one image. Nothing is decoded or computed for a request
    /// whose deadline has passed; a request abandoned by its caller (this future dropped)
    /// is removed from the queue before its batch is formed.
    pub async fn detect(
        &self,
        permit: &AdmissionPermit,
        image: Bytes,
        params: DetectParams,
        deadline: Instant,
    ) -> Result<ImageResult, RequestError> {
        permit.settle();
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
        permit: &AdmissionPermit,
        data: Bytes,
        deadline: Instant,
    ) -> Result<TensorResult, RequestError> {
        permit.settle();
        let started = Instant::now();
        let outcome = self.infer_tensor_inner(data, deadline).await;
        self.finish(started, &outcome);
        outcome
    }

    /// Whether requests that allow it should go to the model's fallback now: the wait a
    /// new request can expect passed the objective and has not yet come back under half
    /// of it (`crate::divert`). Always false without an objective.
    pub fn diverting(&self) -> bool {
        self.shared.diverting.load(Ordering::Relaxed)
    }

    /// Offers every canvas this engine letterboxes from now on (image requests and video
    /// frames) to `sampler`. An engine feeds one sampler in its life; a second is handed
    /// back.
    pub fn sample_canvases(
        &self,
        sampler: crate::sample::CanvasSampler,
    ) -> Result<(), crate::sample::CanvasSampler> {
        self.shared.sampler.set(sampler)
    }

    /// What one run at the smallest batch took at warm-up, and the objective's P99, when
    /// the run alone is longer: the model can answer nothing within its objective.
    pub fn run_past_objective(&self) -> Option<(Duration, Duration)> {
        self.shared.run_past_objective()
    }

    /// End-to-end latency over the window ending now: P99 of the answered requests and
    /// the failures inside the engine.
    pub fn latency(&self) -> WindowStats {
        self.shared.latency(Instant::now())
    }

    /// The per-version gauges `/metrics` shows for this engine, as of now.
    pub fn gauges(&self) -> crate::telemetry::VersionGauges {
        self.shared.gauges()
    }

    /// Most images per batch right now: the configured `max_batch`, or less while adaptive
    /// batching holds it lower.
    pub fn batch_limit(&self) -> usize {
        self.shared.batch_limit.load(Ordering::Relaxed)
    }

    fn finish<T>(&self, started: Instant, outcome: &Result<T, RequestError>) {
        let took = started.elapsed();
        self.shared.stats.finished(outcome.is_ok(), took);
        // Only the engine's own failures count against its latency window; refusals and
        // the client's bad input say nothing about it.
        match outcome {
            Ok(_) => self.shared.request_ended(Some(took)),
            Err(RequestError::DeadlineExceeded { stage }) => {
                self.shared.request_ended(None);
                telemetry::deadline_exceeded(&self.shared.config.name, stage);
            }
            Err(RequestError::Inference(_)) => self.shared.request_ended(None),
            Err(_) => {}
        }
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
        self.check_admissible(deadline, false, Stage::BeforeDecode)?;
        let spec = &self.shared.spec;
        let (width, height) = (jpeg.width as usize, jpeg.height as usize);
        let letterbox = Letterbox::new(width, height, spec.input_width, spec.input_height);
        let slot = Slot::Jpeg {
            data: image,
            width,
            height,
            letterbox,
            params,
        };
        self.submit_image(slot, deadline, Duration::ZERO, (jpeg.width, jpeg.height))
            .await
    }

    /// Runs `prepare` (decode and letterbox) on the bounded preprocessing pool, then queues
    /// the canvas and waits for its detections; nothing is done past the deadline.
    async fn preprocess_and_detect(
        &self,
        prepare: impl FnOnce(&Shared) -> Result<Prepared, RequestError> + Send + 'static,
        params: DetectParams,
        deadline: Instant,
    ) -> Result<ImageResult, RequestError> {
        self.check_admissible(deadline, true, Stage::BeforeDecode)?;
        let decoding = Decoding::new(&self.shared.decoding);
        let tokio_deadline = tokio::time::Instant::from_std(deadline);
        let expired = |stage| RequestError::DeadlineExceeded { stage };
        let decoder = tokio::time::timeout_at(tokio_deadline, self.shared.preprocess.acquire())
            .await
            .map_err(|_| expired("waiting for a decoder"))?
            .map_err(|_| RequestError::ShuttingDown)?;
        if Instant::now() >= deadline {
            return Err(expired("waiting for a decoder"));
        }
        let shared = self.shared.clone();
        let started = Instant::now();
        let span = spans::decode(&spans::current_request(), self.name(), self.version());
        let prepared = tokio::task::spawn_blocking(move || span.in_scope(|| prepare(&shared)))
            .await
            .map_err(|e| RequestError::Inference(format!("the decoder task failed: {e}")))??;
        drop((decoder, decoding));
        let decode = started.elapsed();
        if Instant::now() >= deadline {
            self.shared.recycle(prepared.canvas);
            return Err(expired("decoding"));
        }
        // The queue may have grown while this image decoded: a request that can no longer
        // make its deadline is refused before it takes a place in the queue.
        let queued = Ahead {
            decoding: 0,
            queued: self.shared.queued.load(Ordering::Relaxed),
        };
        if let Err(refused) = self.check_backlog(deadline, queued, false, Stage::AfterDecode) {
            self.shared.recycle(prepared.canvas);
            return Err(refused);
        }
        let size = (prepared.width, prepared.height);
        self.submit_image(prepared.into_slot(params), deadline, decode, size)
            .await
    }

    /// Queues an image slot and waits for its detections; `size` is the picture's, which
    /// the result reports.
    async fn submit_image(
        &self,
        slot: Slot,
        deadline: Instant,
        decode: Duration,
        (width, height): (u32, u32),
    ) -> Result<ImageResult, RequestError> {
        let (output, t) = self.submit(slot, deadline, decode).await?;
        let detections = match output {
            SlotOutput::Detections(d) => d,
            SlotOutput::Rejected(e) => return Err(RequestError::BadImage(e)),
            SlotOutput::Tensor(_) => {
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
        self.check_admissible(deadline, false, Stage::BeforeDecode)?;
        let (output, t) = self.submit(Slot::Tensor(data), deadline, Duration::ZERO).await?;
        let SlotOutput::Tensor(data) = output else {
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
        slot: Slot,
        deadline: Instant,
        decode: Duration,
    ) -> Result<(SlotOutput, ItemTimings), RequestError> {
        let (reply, answer) = oneshot::channel();
        let request = spans::current_request();
        let entry = Entry {
            slot,
            deadline,
            decode,
            reply,
            queued: spans::queue(&request, self.name(), self.version()),
            request,
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

#[path = "device_frames.rs"]
mod device_frames;

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;

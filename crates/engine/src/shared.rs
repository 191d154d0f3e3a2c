//! What an engine's request futures, queue task and instance threads all read: the
//! configuration, admission and decoder limits, the canvas pool, readiness and the
//! counters behind deadline-aware shedding. Each mutable part has one writer, named on
//! its field; the rest only read.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use crossbeam_queue::ArrayQueue;
use peregrine_backend::ModelDescription;
use peregrine_vision::DetectorSpec;
use tokio::sync::{watch, Semaphore};

use crate::rotation::InstancePlacement;
use crate::stats::EngineStats;
use crate::telemetry::VersionGauges;
use crate::wait::{Ahead, WaitEstimator};
use crate::window::{LatencyWindow, WindowStats};
use crate::EngineConfig;

/// How far the instances have got with warming up.
#[derive(Debug, Clone, Default)]
pub(crate) struct Readiness {
    pub ready: usize,
    pub failed: Option<String>,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub config: EngineConfig,
    pub spec: DetectorSpec,
    pub description: ModelDescription,
    pub admission: Arc<Semaphore>,
    /// Requests admitted: written by `Engine::try_admit` and the permit's drop.
    pub in_flight: AtomicUsize,
    pub preprocess: Semaphore,
    /// Written by the instance threads.
    pub readiness: watch::Sender<Readiness>,
    buffers: ArrayQueue<Vec<u8>>,
    /// Images waiting in the batch queue, as the queue task last saw it.
    pub queued: AtomicUsize,
    /// Requests decoding or waiting for a decoder: written by the request futures.
    pub decoding: AtomicUsize,
    /// Requests past the check before their body was read that have not reached a decoder
    /// yet (reading their bodies): written by their `AdmissionPermit`s.
    pub admitted: AtomicUsize,
    /// The queue task's wait estimator as of its last change: published by the queue task,
    /// read at admission.
    pub wait: ArcSwap<WaitEstimator>,
    /// The batch limit in force (adaptive batching lowers it): written by the queue task.
    pub batch_limit: AtomicUsize,
    /// The batching delay in force, in nanoseconds: written by the queue task.
    batch_delay_ns: AtomicU64,
    /// Batches running on the instances right now.
    pub running: AtomicUsize,
    /// Requests that allow it should go to the model's fallback (`crate::divert`): written
    /// by the queue task, read at routing.
    pub diverting: AtomicBool,
    pub stats: EngineStats,
    /// End-to-end latencies over the objective's window: written as each request ends,
    /// read by the queue task once a tick (a short lock either way).
    latency: Mutex<LatencyWindow>,
    /// One image's raw output shape (without the batch dimension), known after warm-up.
    pub output_shape: OnceLock<Vec<usize>>,
    /// What one run at the smallest batch took at the first instance's warm-up.
    pub single_run: OnceLock<Duration>,
    /// The instances decode baseline JPEGs on the device: such requests skip the CPU.
    pub device_jpeg: bool,
    /// The GPU every instance takes video frames on (in its memory, converted there).
    pub frames_device: Option<i32>,
    /// Each instance's device and whether it is in rotation: published by the queue task
    /// when a device fails, read by status and `/metrics`.
    pub placement: ArcSwap<Vec<InstancePlacement>>,
    /// Set by the queue task once no instance is left in rotation: why.
    pub no_instances: OnceLock<String>,
    /// Where letterboxed canvases are offered, once someone wants a sample of them
    /// (`Engine::sample_canvases`): set once, read by the preprocessing threads.
    pub sampler: OnceLock<crate::sample::CanvasSampler>,
}

impl Shared {
    /// `config.policy` must already be fitted to the model (its `max_batch` within the
    /// model's batch size).
    pub fn new(
        config: EngineConfig,
        spec: DetectorSpec,
        description: ModelDescription,
        device_jpeg: bool,
        frames_device: Option<i32>,
        devices: &[Option<i32>],
    ) -> Self {
        let policy = &config.policy;
        // Every canvas that can be alive at once: queued, in the running batches, being
        // letterboxed, and one spare.
        let pool_size =
            policy.capacity + config.instances.max(1) * policy.max_batch + config.preprocess_threads + 1;
        Self {
            admission: Arc::new(Semaphore::new(config.max_in_flight.max(1))),
            in_flight: AtomicUsize::new(0),
            preprocess: Semaphore::new(config.preprocess_threads.max(1)),
            readiness: watch::Sender::new(Readiness::default()),
            buffers: ArrayQueue::new(pool_size),
            queued: AtomicUsize::new(0),
            decoding: AtomicUsize::new(0),
            admitted: AtomicUsize::new(0),
            wait: ArcSwap::from_pointee(WaitEstimator::new(
                policy.max_batch,
                config.instances,
                config.preprocess_threads,
                policy.max_delay,
            )),
            batch_limit: AtomicUsize::new(policy.max_batch),
            batch_delay_ns: AtomicU64::new(nanos(policy.max_delay)),
            running: AtomicUsize::new(0),
            diverting: AtomicBool::new(false),
            stats: EngineStats::new(policy.max_batch),
            latency: Mutex::new(LatencyWindow::new(config.latency_window(), Instant::now())),
            output_shape: OnceLock::new(),
            single_run: OnceLock::new(),
            device_jpeg,
            frames_device,
            placement: ArcSwap::from_pointee(
                devices
                    .iter()
                    .map(|&device| InstancePlacement {
                        device,
                        retired: None,
                    })
                    .collect(),
            ),
            no_instances: OnceLock::new(),
            sampler: OnceLock::new(),
            spec,
            description,
            config,
        }
    }

    /// A canvas from the pool, or a new (empty) one when the pool has none.
    pub fn canvas(&self) -> Vec<u8> {
        self.buffers.pop().unwrap_or_default()
    }

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

    fn window(&self) -> std::sync::MutexGuard<'_, LatencyWindow> {
        // A panic while holding the lock leaves the histograms whole: keep using them.
        self.latency
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A request answered after `latency`, or (`None`) one that failed inside the engine.
    pub fn request_ended(&self, latency: Option<Duration>) {
        let now = Instant::now();
        match latency {
            Some(took) => self.window().answered(took, now),
            None => self.window().failed(now),
        }
    }

    pub fn latency(&self, now: Instant) -> WindowStats {
        self.window().stats(now)
    }

    /// The warm-up's single run and the objective's P99, when the run alone is longer:
    /// no request can then be answered within the objective.
    pub fn run_past_objective(&self) -> Option<(Duration, Duration)> {
        let run = *self.single_run.get()?;
        let p99 = self.config.objective.as_ref()?.p99;
        (run > p99).then_some((run, p99))
    }

    /// Adaptive batching set new limits.
    pub fn set_batch_limits(&self, max_batch: usize, max_delay: Duration) {
        self.batch_limit.store(max_batch, Ordering::Relaxed);
        self.batch_delay_ns.store(nanos(max_delay), Ordering::Relaxed);
    }

    /// The version's gauges as of now, for `/metrics`.
    pub fn gauges(&self) -> VersionGauges {
        VersionGauges {
            p99: self.latency(Instant::now()).p99,
            objective: self.config.objective.as_ref().map(|o| o.p99),
            batch_limit: self.batch_limit.load(Ordering::Relaxed),
            batch_delay: Duration::from_nanos(self.batch_delay_ns.load(Ordering::Relaxed)),
        }
    }

    /// What a request arriving now has in front of it, besides the running batches: the
    /// requests admitted and still reading their bodies will need a decoder first too.
    pub fn ahead(&self) -> Ahead {
        Ahead {
            decoding: self.decoding.load(Ordering::Relaxed) + self.admitted.load(Ordering::Relaxed),
            queued: self.queued.load(Ordering::Relaxed),
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Counts one request as decoding (waiting for a decoder or holding one) while it lives,
/// however the request ends.
pub(crate) struct Decoding<'a>(&'a AtomicUsize);

impl<'a> Decoding<'a> {
    pub fn new(counter: &'a AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Self(counter)
    }
}

impl Drop for Decoding<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

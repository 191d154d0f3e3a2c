//! What an engine's request futures, queue task and instance threads all read: the
//! configuration, admission and decoder limits, the canvas pool, readiness and the
//! counters behind deadline-aware shedding. Each mutable part has one writer, named on
//! its field; the rest only read.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use peregrine_backend::ModelDescription;
use peregrine_vision::DetectorSpec;
use tokio::sync::{watch, Semaphore};

use crate::stats::EngineStats;
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
    /// Recent time of one full batch, in nanoseconds (moving average; 0 until measured).
    ns_per_batch: AtomicU64,
    /// Batches running on the instances right now.
    pub running: AtomicUsize,
    pub stats: EngineStats,
    /// One image's raw output shape (without the batch dimension), known after warm-up.
    pub output_shape: OnceLock<Vec<usize>>,
    /// The instances decode baseline JPEGs on the device: such requests skip the CPU.
    pub device_jpeg: bool,
}

impl Shared {
    /// `config.policy` must already be fitted to the model (its `max_batch` within the
    /// model's batch size).
    pub fn new(
        config: EngineConfig,
        spec: DetectorSpec,
        description: ModelDescription,
        device_jpeg: bool,
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
            ns_per_batch: AtomicU64::new(0),
            running: AtomicUsize::new(0),
            stats: EngineStats::new(policy.max_batch),
            output_shape: OnceLock::new(),
            device_jpeg,
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

    /// How long a request arriving now would wait for its result: the batches queued
    /// ahead of it (counted as full ones) plus those running, shared among the instances.
    /// Nothing queued and nothing running means no wait, whatever past batches cost, so a
    /// slow spell can never lock the engine into refusing everything.
    pub fn expected_wait(&self) -> Duration {
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

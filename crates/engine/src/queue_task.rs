//! The queue task: the one owner of an engine's [`BatchQueue`]. Requests arrive as
//! [`Command::Enqueue`], idle model instances as [`Command::Idle`]; the task only moves
//! messages, while the pure queue decides what runs when.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::adaptive::{AdaptiveBatcher, BatchFill, BatchLimits};
use crate::divert::Divert;
use crate::queue::{BatchPolicy, BatchQueue, Dropped, NextBatch, QueueItem};
use crate::request::RequestError;
use crate::rotation::{device_label, Rotation};
use crate::shared::Shared;
use crate::slot::{Slot, SlotOutput};
use crate::telemetry;
use crate::wait::WaitEstimator;

/// Where a slot's answer goes: its output and timings, or why it got none.
pub(crate) type Reply = oneshot::Sender<Result<(SlotOutput, ItemTimings), RequestError>>;

/// One queued slot and its caller.
pub(crate) struct Entry {
    pub slot: Slot,
    pub deadline: Instant,
    /// Time spent decoding and letterboxing before the entry was queued.
    pub decode: Duration,
    pub reply: Reply,
    /// The caller's span, for traces (none when nobody traces the request).
    pub request: tracing::Span,
    /// The request's `queue` span: it ends when the entry leaves the queue.
    pub queued: tracing::Span,
}

/// Where one slot's time went inside the engine, after decoding.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ItemTimings {
    pub queue: Duration,
    /// The whole batch's normalisation, model run and postprocessing.
    pub batch: Duration,
    pub batch_size: usize,
}

impl Entry {
    /// Gives an image entry's canvas back to the pool, leaving the reply to answer.
    pub fn recycle_into(self, shared: &Shared) -> Reply {
        if let Some(canvas) = self.slot.into_canvas() {
            shared.recycle(canvas);
        }
        self.reply
    }
}

impl QueueItem for Entry {
    fn deadline(&self) -> Instant {
        self.deadline
    }
    fn is_abandoned(&self) -> bool {
        self.reply.is_closed()
    }
}

pub(crate) type Batch = Vec<(Entry, Duration)>;

// Nearly every command is an `Enqueue`: boxing it would only add an allocation per request.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Command {
    Enqueue(Entry),
    /// An instance warmed up: the time each batch size took (size, duration).
    WarmedUp(Vec<(usize, Duration)>),
    /// Instance number `instance` is idle (its last batch, if any, is done) and waits on
    /// `reply` for its next batch.
    Idle {
        instance: usize,
        reply: oneshot::Sender<Batch>,
    },
    /// Instance number `instance` found its device unusable running `batch`, which comes
    /// back unanswered; the instance has stopped.
    DeviceLost {
        instance: usize,
        reason: String,
        batch: Vec<Entry>,
    },
}

/// Runs until every sender of `commands` is gone (every `Engine` handle dropped and every
/// request finished), then answers what is left and ends, which in turn ends the
/// instance threads waiting on it.
pub(crate) async fn run_queue(
    mut commands: mpsc::Receiver<Command>,
    policy: BatchPolicy,
    shared: Arc<Shared>,
) {
    let mut task = QueueTask::new(policy, shared);
    let tick = task.tick_interval();
    let mut next_tick = Instant::now() + tick;
    // Ticks (reading the latency window) come round even while nothing else happens.
    let mut wake = next_tick;
    loop {
        let command = tokio::select! {
            c = commands.recv() => match c { Some(c) => Some(c), None => break },
            _ = tokio::time::sleep_until(tokio::time::Instant::from_std(wake)) => None,
        };
        let now = Instant::now();
        if let Some(command) = command {
            task.take(command, now);
        }
        if now >= next_tick {
            task.tick(now);
            next_tick = now + tick;
        }
        wake = task.dispatch(now).map_or(next_tick, |at| at.min(next_tick));
    }
    for entry in task.queue.drain_all() {
        let _ = entry
            .recycle_into(&task.shared)
            .send(Err(RequestError::ShuttingDown));
    }
}

/// The queue task's state: the queue, the idle instances and the wait estimator, all
/// owned here alone.
struct QueueTask {
    shared: Arc<Shared>,
    model: String,
    capacity: usize,
    queue: BatchQueue<Entry>,
    idle: Vec<(usize, oneshot::Sender<Batch>)>,
    wait: WaitEstimator,
    /// Which instances take work (all, until a device fails).
    rotation: Rotation,
    /// Adaptive batching, once the instances have said which sizes they run.
    adaptive: Option<AdaptiveBatcher>,
    /// Batches handed out since the last tick.
    fill: BatchFill,
    /// Whether to send requests to the fallback, when the model has an objective and a
    /// fallback (without one, nothing reads the answer: no estimate is made).
    divert: Option<Divert>,
}

impl QueueTask {
    fn new(policy: BatchPolicy, shared: Arc<Shared>) -> Self {
        let config = &shared.config;
        let wait = WaitEstimator::new(
            policy.max_batch,
            config.instances,
            config.preprocess_threads,
            policy.max_delay,
        );
        Self {
            model: config.name.clone(),
            capacity: policy.capacity,
            queue: BatchQueue::new(policy),
            idle: Vec::new(),
            wait,
            rotation: Rotation::new(shared.placement.load().iter().map(|p| p.device).collect()),
            adaptive: None,
            fill: BatchFill::default(),
            divert: config
                .objective
                .as_ref()
                .filter(|_| config.has_fallback)
                .map(|o| Divert::new(o.p99)),
            shared,
        }
    }

    fn take(&mut self, command: Command, now: Instant) {
        match command {
            Command::Enqueue(entry) if self.rotation.serving() == 0 => self.no_instances(entry),
            Command::Enqueue(entry) => {
                if !entry.decode.is_zero() {
                    self.wait.observe_decode(entry.decode);
                }
                if let Err(entry) = self.queue.push(entry, now) {
                    telemetry::refused(&self.model, "queue_full");
                    let _ = entry
                        .recycle_into(&self.shared)
                        .send(Err(RequestError::QueueFull {
                            model: self.model.clone(),
                            capacity: self.capacity,
                        }));
                }
            }
            Command::WarmedUp(costs) => {
                self.start_adaptive(&costs);
                for (size, took) in costs {
                    self.wait.observe_batch(size, took);
                }
            }
            // Dropping the reply of an instance out of rotation ends its thread.
            Command::Idle { instance, .. } if !self.rotation.in_rotation(instance) => {}
            Command::Idle { instance, reply } => {
                self.wait.instance_idle(instance, now);
                self.idle.push((instance, reply));
            }
            Command::DeviceLost {
                instance,
                reason,
                batch,
            } => self.device_lost(instance, &reason, batch, now),
        }
    }

    /// Takes the failed device's instances out of rotation and queues the batch again, at
    /// the head, for the instances left; with none left, every request fails at once.
    fn device_lost(&mut self, instance: usize, reason: &str, batch: Vec<Entry>, now: Instant) {
        self.wait.retire(instance);
        if let Some(out) = self.rotation.device_lost(instance, reason) {
            let config = &self.shared.config;
            tracing::error!(
                model = %config.name, version = %config.version, device = %device_label(out.device),
                instances = ?out.instances, serving = out.serving, reason = %out.reason,
                "a GPU failed: its model instances are out of rotation; the others go on serving"
            );
            telemetry::device_lost(&self.model, &device_label(out.device));
            for &i in &out.instances {
                self.wait.retire(i);
            }
            let rotation = &self.rotation;
            self.idle.retain(|(i, _)| rotation.in_rotation(*i));
            self.shared
                .placement
                .store(Arc::new(rotation.placement().to_vec()));
            if out.serving == 0 {
                let _ = self.shared.no_instances.set(out.reason.clone());
            }
        }
        if self.rotation.serving() == 0 {
            for entry in batch.into_iter().chain(self.queue.drain_all()) {
                self.no_instances(entry);
            }
        } else {
            telemetry::requeued(&self.model, batch.len());
            self.queue.requeue(batch, now);
        }
    }

    fn no_instances(&self, entry: Entry) {
        let reason = self
            .shared
            .no_instances
            .get()
            .cloned()
            .unwrap_or_else(|| "every instance is out of rotation".into());
        let _ = entry
            .recycle_into(&self.shared)
            .send(Err(RequestError::NoInstances {
                model: self.model.clone(),
                reason,
            }));
    }

    /// Hands batches to idle instances while there are both, answers what the queue
    /// dropped, publishes the queue's state, and says when to look again.
    fn dispatch(&mut self, now: Instant) -> Option<Instant> {
        let mut dropped = Dropped::default();
        let wake = loop {
            self.idle.retain(|(_, reply)| !reply.is_closed());
            let Some((instance, reply)) = self.idle.pop() else {
                self.queue.sweep(now, &mut dropped);
                break self.queue.earliest_deadline();
            };
            match self.queue.next_batch(now, &mut dropped) {
                NextBatch::Run(batch) => self.hand_over(instance, reply, batch, now),
                NextBatch::WaitUntil(at) => {
                    self.idle.push((instance, reply));
                    break Some(self.queue.earliest_deadline().map_or(at, |d| d.min(at)));
                }
                NextBatch::Empty => {
                    self.idle.push((instance, reply));
                    break None;
                }
            }
        };
        telemetry::dropped(&self.model, "expired", dropped.expired.len());
        telemetry::dropped(&self.model, "abandoned", dropped.abandoned.len());
        for entry in dropped.expired.into_iter().chain(dropped.abandoned) {
            let _ = entry
                .recycle_into(&self.shared)
                .send(Err(RequestError::DeadlineExceeded { stage: "queued" }));
        }
        self.shared.queued.store(self.queue.len(), Ordering::Relaxed);
        self.shared.wait.store(Arc::new(self.wait.clone()));
        telemetry::queue_depth(&self.model, self.queue.len());
        if let Some(divert) = self.divert.as_mut() {
            let expected = self.wait.estimate(self.shared.ahead(), true, now);
            let on = divert.observe(expected);
            if self.shared.diverting.swap(on, Ordering::Relaxed) != on {
                tracing::info!(model = %self.model, diverting = on, expected_ms = expected.as_secs_f64() * 1e3, "fallback diverting changed");
            }
        }
        wake
    }

    fn hand_over(&mut self, instance: usize, reply: oneshot::Sender<Batch>, batch: Batch, now: Instant) {
        for (_, waited) in &batch {
            telemetry::queued(&self.model, *waited);
            self.shared.stats.queued(*waited);
        }
        let size = batch.len();
        self.fill.batches += 1;
        self.fill.images += size as u64;
        match reply.send(batch) {
            Ok(()) => self.wait.batch_started(instance, size, now),
            Err(batch) => self.instance_stopped(batch),
        }
    }

    /// How often the latency window is read: ten times a window, at least every 100 ms.
    fn tick_interval(&self) -> Duration {
        (self.shared.config.latency_window() / 10).max(Duration::from_millis(100))
    }

    /// Starts adaptive batching (when the objective asks for it) over the batch sizes the
    /// first instance warmed up, the only sizes worth limiting batches to.
    fn start_adaptive(&mut self, costs: &[(usize, Duration)]) {
        let Some(objective) = self
            .shared
            .config
            .objective
            .as_ref()
            .filter(|o| o.adaptive_batching)
        else {
            return;
        };
        if self.adaptive.is_some() {
            return;
        }
        let policy = self.queue.policy();
        let ceiling = BatchLimits {
            max_batch: policy.max_batch,
            max_delay: policy.max_delay,
        };
        let sizes: Vec<usize> = costs.iter().map(|&(size, _)| size).collect();
        self.adaptive = Some(AdaptiveBatcher::new(objective, ceiling, &sizes));
    }

    /// Lets adaptive batching judge the latency window (read only when it runs).
    fn tick(&mut self, now: Instant) {
        let fill = std::mem::take(&mut self.fill);
        let Some(adaptive) = self.adaptive.as_mut() else {
            return;
        };
        let config = &self.shared.config;
        let window = self.shared.latency(now);
        let Some((_, change)) = adaptive.observe(&window, fill, now) else {
            return;
        };
        let limits = adaptive.limits();
        let objective = config.objective.as_ref().map(|o| o.p99);
        tracing::info!(
            model = %config.name, version = %config.version, reason = change.as_str(),
            p99_ms = window.p99.as_secs_f64() * 1e3,
            objective_ms = objective.unwrap_or_default().as_secs_f64() * 1e3,
            max_batch = limits.max_batch, max_delay_us = limits.max_delay.as_micros() as u64,
            "adaptive batching changed the batch limits"
        );
        self.queue.set_limits(limits.max_batch, limits.max_delay);
        self.shared.set_batch_limits(limits.max_batch, limits.max_delay);
        self.wait.set_limits(limits.max_batch, limits.max_delay);
        telemetry::batch_limits_changed(&config.name, &config.version, change.as_str());
    }

    fn instance_stopped(&self, batch: Batch) {
        for (entry, _) in batch {
            let _ = entry
                .recycle_into(&self.shared)
                .send(Err(RequestError::Inference("the model instance stopped".into())));
        }
    }
}

//! The queue task: the one owner of an engine's [`BatchQueue`]. Requests arrive as
//! [`Command::Enqueue`], idle model instances as [`Command::Idle`]; the task only moves
//! messages, while the pure queue decides what runs when.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::queue::{BatchPolicy, BatchQueue, Dropped, NextBatch, QueueItem};
use crate::request::RequestError;
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
        if let Some(command) = command {
            task.take(command, now);
        }
        wake = task.dispatch(now);
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
            shared,
        }
    }

    fn take(&mut self, command: Command, now: Instant) {
        match command {
            Command::Enqueue(entry) => {
                if !entry.decode.is_zero() {
                    self.wait.observe_decode(entry.decode);
                }
                if let Err(entry) = self.queue.push(entry, now) {
                    let _ = entry
                        .recycle_into(&self.shared)
                        .send(Err(RequestError::QueueFull {
                            model: self.model.clone(),
                            capacity: self.capacity,
                        }));
                }
            }
            Command::WarmedUp(costs) => {
                for (size, took) in costs {
                    self.wait.observe_batch(size, took);
                }
            }
            Command::Idle { instance, reply } => {
                self.wait.instance_idle(instance, now);
                self.idle.push((instance, reply));
            }
        }
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
        wake
    }

    fn hand_over(&mut self, instance: usize, reply: oneshot::Sender<Batch>, batch: Batch, now: Instant) {
        for (_, waited) in &batch {
            telemetry::queued(&self.model, *waited);
            self.shared.stats.queued(*waited);
        }
        let size = batch.len();
        match reply.send(batch) {
            Ok(()) => self.wait.batch_started(instance, size, now),
            Err(batch) => self.instance_stopped(batch),
        }
    }

    fn instance_stopped(&self, batch: Batch) {
        for (entry, _) in batch {
            let _ = entry
                .recycle_into(&self.shared)
                .send(Err(RequestError::Inference("the model instance stopped".into())));
        }
    }
}

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
    /// An instance is idle and waits on this sender for its next batch.
    Idle(oneshot::Sender<Batch>),
}

/// Runs until every sender of `commands` is gone (every `Engine` handle dropped and every
/// request finished), then answers what is left and ends, which in turn ends the
/// instance threads waiting on it.
pub(crate) async fn run_queue(
    mut commands: mpsc::Receiver<Command>,
    policy: BatchPolicy,
    shared: Arc<Shared>,
) {
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
                    let _ = entry.recycle_into(&shared).send(Err(RequestError::QueueFull {
                        model: model.clone(),
                        capacity,
                    }));
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
                        shared.stats.queued(*waited);
                    }
                    if let Err(batch) = instance.send(batch) {
                        for (entry, _) in batch {
                            let _ = entry
                                .recycle_into(&shared)
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
                .recycle_into(&shared)
                .send(Err(RequestError::DeadlineExceeded { stage: "queued" }));
        }
        shared.queued.store(queue.len(), Ordering::Relaxed);
        telemetry::queue_depth(&model, queue.len());
    }
    for entry in queue.drain_all() {
        let _ = entry.recycle_into(&shared).send(Err(RequestError::ShuttingDown));
    }
}

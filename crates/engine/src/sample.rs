//! A bounded sample of the canvases an engine letterboxes (images and video frames alike),
//! for a consumer outside the serving path: the registry's online calibration.
//!
//! Offering a canvas costs a few atomic operations once the sample is complete, no
//! consumer is attached or the consumer is behind; only a canvas that is taken is copied
//! (one canvas, e.g. 1.2 MB at 640x640, on the preprocessing thread that made it). The
//! hand-off never waits: when the consumer's queue is full, the canvas is not taken and
//! a later one is.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;

/// Canvases waiting for the consumer at most (each one canvas of memory).
const QUEUE: usize = 2;

/// The sending side, held by an engine (see `Engine::sample_canvases`).
#[derive(Debug)]
pub struct CanvasSampler {
    /// Canvases still wanted.
    wanted: AtomicUsize,
    /// Take one canvas out of every `every` offered.
    every: u64,
    offered: AtomicU64,
    /// Offers not taken because the consumer's queue was full.
    skipped: AtomicU64,
    queue: SyncSender<Vec<u8>>,
    /// Canvases sent and not yet received, so that a full queue is seen before copying.
    pending: Arc<AtomicUsize>,
}

/// The consumer's side.
#[derive(Debug)]
pub struct CanvasReceiver {
    queue: Receiver<Vec<u8>>,
    pending: Arc<AtomicUsize>,
}

impl CanvasReceiver {
    /// The next canvas, waiting for it; `None` once the sampler is gone (its engine
    /// stopped).
    pub fn recv(&self) -> Option<Vec<u8>> {
        let canvas = self.queue.recv().ok()?;
        self.pending.fetch_sub(1, Ordering::Relaxed);
        Some(canvas)
    }
}

/// `count` canvases, one of every `every` letterboxed, through a queue of [`QUEUE`]; the
/// receiver ends once the engine holding the sampler stops.
pub fn canvas_sample(count: usize, every: u64) -> (CanvasSampler, CanvasReceiver) {
    let (queue, receiver) = sync_channel(QUEUE);
    let pending = Arc::new(AtomicUsize::new(0));
    let sampler = CanvasSampler {
        wanted: AtomicUsize::new(count),
        every: every.max(1),
        offered: AtomicU64::new(0),
        skipped: AtomicU64::new(0),
        queue,
        pending: pending.clone(),
    };
    let receiver = CanvasReceiver {
        queue: receiver,
        pending,
    };
    (sampler, receiver)
}

impl CanvasSampler {
    /// Offers one canvas; returns whether a copy was taken.
    pub fn offer(&self, canvas: &[u8]) -> bool {
        if self.wanted.load(Ordering::Relaxed) == 0 {
            return false;
        }
        if !self
            .offered
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(self.every)
        {
            return false;
        }
        // Claim a place in the queue, then one of the wanted canvases, before copying, so
        // that concurrent offers never copy for a full queue nor send more than asked for.
        let placed = self
            .pending
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                (p < QUEUE).then_some(p + 1)
            })
            .is_ok();
        if !placed {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let claimed = self
            .wanted
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| w.checked_sub(1))
            .is_ok();
        if !claimed {
            self.pending.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        match self.queue.try_send(canvas.to_vec()) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                // Not reached while `pending` counts right; handled all the same.
                self.pending.fetch_sub(1, Ordering::Relaxed);
                self.wanted.fetch_add(1, Ordering::Relaxed);
                self.skipped.fetch_add(1, Ordering::Relaxed);
                false
            }
            Err(TrySendError::Disconnected(_)) => {
                // The consumer is gone: nothing more is wanted.
                self.wanted.store(0, Ordering::Relaxed);
                false
            }
        }
    }

    /// Canvases still wanted.
    pub fn wanted(&self) -> usize {
        self.wanted.load(Ordering::Relaxed)
    }

    /// Offers passed over because the consumer was behind.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_exactly_the_count_then_nothing() {
        let (sampler, receiver) = canvas_sample(3, 1);
        let mut taken = 0;
        for i in 0..10u8 {
            if sampler.offer(&[i; 4]) {
                taken += 1;
                assert_eq!(receiver.recv(), Some(vec![i; 4]));
            }
        }
        assert_eq!(taken, 3);
        assert_eq!(sampler.wanted(), 0);
    }

    #[test]
    fn takes_one_of_every_n() {
        let (sampler, receiver) = canvas_sample(10, 3);
        for i in 0..7u8 {
            if sampler.offer(&[i]) {
                let c = receiver.recv().unwrap();
                assert_eq!(c[0] % 3, 0, "took offer {}", c[0]);
            }
        }
        assert_eq!(sampler.wanted(), 10 - 3); // offers 0, 3 and 6
    }

    #[test]
    fn a_full_queue_skips_without_losing_the_claim() {
        let (sampler, receiver) = canvas_sample(5, 1);
        for i in 0..(QUEUE as u8 + 2) {
            sampler.offer(&[i]);
        }
        assert_eq!(sampler.skipped(), 2);
        assert_eq!(sampler.wanted(), 5 - QUEUE);
        assert_eq!(receiver.recv(), Some(vec![0]));
        assert!(sampler.offer(&[9]), "room again after one was received");
    }

    #[test]
    fn a_gone_consumer_ends_the_sample() {
        let (sampler, receiver) = canvas_sample(5, 1);
        drop(receiver);
        assert!(!sampler.offer(&[1]));
        assert_eq!(sampler.wanted(), 0);
    }

    #[test]
    fn the_receiver_ends_when_the_sampler_goes() {
        let (sampler, receiver) = canvas_sample(5, 1);
        assert!(sampler.offer(&[1]));
        drop(sampler);
        assert_eq!(receiver.recv(), Some(vec![1]));
        assert_eq!(receiver.recv(), None);
    }
}

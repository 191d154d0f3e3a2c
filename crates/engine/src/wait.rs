//! How long a request would wait for its answer, as plain state: no clock of its own, no
//! channels. The queue task owns one [`WaitEstimator`], tells it when each instance takes
//! and finishes a batch and how long decoding took, and publishes a copy after each change;
//! a request reads the copy to decide, before any work is spent on it, whether it can be
//! answered within its deadline.
//!
//! The estimate follows the request's own path: its turn at a decoder (behind the images
//! decoding or waiting for a decoder), then its place in the batch queue (behind every
//! image queued or decoding ahead of it, in batches of `max_batch`), on whichever instance
//! frees up first (the batches running now finish at their start plus their size's cost),
//! then its own batch. A batch's cost is the instance's whole cycle, from hand-over to the
//! next request for work, learned per batch size.

use std::time::{Duration, Instant};

/// Weight of a new sample in the moving averages: follows a change of machine speed
/// within a few batches, while one slow batch moves the average by only a quarter.
const NEW_SAMPLE_WEIGHT: f64 = 0.25;

/// What a request has in front of it, besides the running batches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ahead {
    /// Images decoding or waiting for a decoder (they reach the batch queue first).
    pub decoding: usize,
    /// Images in the batch queue.
    pub queued: usize,
}

/// Learned costs and the instances' current batches.
#[derive(Debug, Clone)]
pub struct WaitEstimator {
    /// The largest batch an instance was warmed for: costs are learned up to it.
    max_batch: usize,
    /// The batch limit in force (at most `max_batch`; lowered by adaptive batching).
    limit: usize,
    decoders: usize,
    /// Longest the queue holds a partial batch for company.
    max_delay: Duration,
    /// Index `size - 1`: the moving average of one batch's cycle, once one has run.
    batch: Vec<Option<f64>>,
    /// Seconds one image takes to decode and letterbox (moving average).
    decode: Option<f64>,
    /// Per instance: the size of the batch it runs and when it got it.
    running: Vec<Option<(usize, Instant)>>,
    /// Per instance: out of rotation (its device failed), so it takes no more batches.
    retired: Vec<bool>,
}

impl WaitEstimator {
    pub fn new(max_batch: usize, instances: usize, decoders: usize, max_delay: Duration) -> Self {
        let max_batch = max_batch.max(1);
        Self {
            max_batch,
            limit: max_batch,
            decoders: decoders.max(1),
            max_delay,
            batch: vec![None; max_batch],
            decode: None,
            running: vec![None; instances.max(1)],
            retired: vec![false; instances.max(1)],
        }
    }

    /// `instance` left the rotation: its batch, if any, will not finish, and it takes no
    /// more.
    pub fn retire(&mut self, instance: usize) {
        if let (Some(r), Some(out)) = (self.running.get_mut(instance), self.retired.get_mut(instance)) {
            *r = None;
            *out = true;
        }
    }

    /// The queue now forms batches of at most `limit` and holds a partial one up to
    /// `max_delay`; what was learned about each size is kept.
    pub fn set_limits(&mut self, limit: usize, max_delay: Duration) {
        self.limit = limit.clamp(1, self.max_batch);
        self.max_delay = max_delay;
    }

    /// One batch of `size` images took `took`, hand-over to the next request for work.
    pub fn observe_batch(&mut self, size: usize, took: Duration) {
        if let Some(cost) = self.batch.get_mut(size.clamp(1, self.max_batch) - 1) {
            *cost = Some(blend(*cost, took.as_secs_f64()));
        }
    }

    /// One image took `took` to decode and letterbox.
    pub fn observe_decode(&mut self, took: Duration) {
        self.decode = Some(blend(self.decode, took.as_secs_f64()));
    }

    /// `instance` took a batch of `size` at `now`.
    pub fn batch_started(&mut self, instance: usize, size: usize, now: Instant) {
        if let Some(r) = self.running.get_mut(instance) {
            *r = Some((size, now));
        }
    }

    /// `instance` asks for work again at `now`: its batch, if it had one, is done and its
    /// cycle is learned.
    pub fn instance_idle(&mut self, instance: usize, now: Instant) {
        if let Some((size, started)) = self.running.get_mut(instance).and_then(Option::take) {
            self.observe_batch(size, now.saturating_duration_since(started));
        }
    }

    /// The learned cost of a batch of `size`: its own average, or failing that the nearest
    /// measured size's, scaled in proportion to the images. `None` before any batch ran.
    pub fn batch_cost(&self, size: usize) -> Option<Duration> {
        let size = size.clamp(1, self.max_batch);
        let nearest = (1..=self.max_batch)
            .filter_map(|s| self.batch[s - 1].map(|c| (s, c)))
            .min_by_key(|&(s, _)| s.abs_diff(size))?;
        let (measured, secs) = nearest;
        Some(Duration::from_secs_f64(secs * size as f64 / measured as f64))
    }

    /// How long a request arriving at `now` with `ahead` in front of it would take to be
    /// answered; `decodes` says whether it needs a decoder first. Zero until a batch has
    /// run: with nothing learned there is nothing to go on.
    pub fn estimate(&self, ahead: Ahead, decodes: bool, now: Instant) -> Duration {
        let (Some(full), Some(_)) = (self.batch_cost(self.limit), self.batch_cost(1)) else {
            return Duration::ZERO;
        };
        // When each instance in rotation can take its next batch.
        let mut free: Vec<Instant> = self
            .running
            .iter()
            .zip(&self.retired)
            .filter(|(_, retired)| !**retired)
            .map(|(r, _)| match r {
                Some((size, started)) => (*started + self.batch_cost(*size).unwrap_or(full)).max(now),
                None => now,
            })
            .collect();
        if free.is_empty() {
            // Nothing left to run it: no deadline can be met. (Finite, so that callers may
            // still scale it.)
            return Duration::from_secs(1 << 32);
        }
        let position = ahead.queued + ahead.decoding;
        for _ in 0..position / self.limit {
            let first = earliest(&mut free);
            *first += full;
        }
        let decoded = if decodes {
            let turns = ahead.decoding / self.decoders + 1;
            now + Duration::from_secs_f64(self.decode.unwrap_or(0.0) * turns as f64)
        } else {
            now
        };
        let start = (*earliest(&mut free)).max(decoded);
        let own = if start > now {
            // While it waits for an instance, more requests arrive behind it: under load its
            // batch fills up.
            full
        } else {
            let own_size = position % self.limit + 1;
            // A partial batch may wait for company.
            let company = if own_size < self.limit {
                self.max_delay
            } else {
                Duration::ZERO
            };
            self.batch_cost(own_size).unwrap_or(full) + company
        };
        (start + own).saturating_duration_since(now)
    }

    /// Whether nothing is ahead of a new request: it then is admitted whatever the
    /// estimate, so that one slow spell cannot lock the engine into refusing everything
    /// (with nothing admitted, nothing would be learned).
    pub fn is_idle(&self, ahead: Ahead) -> bool {
        ahead == Ahead::default() && self.running.iter().all(Option::is_none)
    }
}

fn blend(old: Option<f64>, sample: f64) -> f64 {
    match old {
        Some(old) => old + NEW_SAMPLE_WEIGHT * (sample - old),
        None => sample,
    }
}

fn earliest(free: &mut [Instant]) -> &mut Instant {
    free.iter_mut()
        .min()
        .expect("an estimator has at least one instance")
}

#[cfg(test)]
#[path = "wait_tests.rs"]
mod tests;

//! Adaptive batching against a latency objective, as plain state: no clock, no channels.
//! The queue task asks [`AdaptiveBatcher::observe`] once per tick with the latency window
//! and how full the batches it handed out were, and applies the limits it returns to its
//! [`crate::queue::BatchQueue`] and wait estimator.
//!
//! AIMD on the P99: a breach with batches that run part full (the batch's own run time or
//! the wait for it to fill is what is too long) halves the batch limit, though never
//! below what the load fills, and the batching delay; a breach with full batches is a
//! backlog (requests arrive at least as fast as batches of this size serve them), which a
//! smaller batch would only make worse (step-load runs showed it on the CPU and on an
//! H200, docs/benchmarks.md), so the limit goes back to its ceiling at once, hold or not. While the P99 stays well under
//! the objective and batches run full (the limit, not the load, sets their size), the
//! limit grows one allowed size at a time, and the delay back towards its configured
//! value. After each change the controller holds still for one
//! window, so that the window it judges next was measured under the new limits only.
//! It never goes above the configured `max_batch` and `max_delay` (the ceiling the sessions
//! were built and warmed for), nor below batches of one without delay.

use std::time::{Duration, Instant};

use crate::window::WindowStats;

/// The window latency is measured over when no objective sets one.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);

/// A model's latency objective and which loops it drives.
#[derive(Debug, Clone, PartialEq)]
pub struct Objective {
    /// End-to-end P99 inside the server the model should keep.
    pub p99: Duration,
    /// The window P99 is measured over.
    pub window: Duration,
    /// Let the queue task adjust the batch limit and delay to keep the objective.
    pub adaptive_batching: bool,
}

impl Objective {
    /// Checks the objective's numbers; the error says which is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.p99.is_zero() {
            return Err("the objective's P99 must be above 0".into());
        }
        if self.window < Duration::from_secs(1) || self.window > Duration::from_secs(3600) {
            return Err(format!(
                "the window must be between 1 s and 1 h (got {} s)",
                self.window.as_secs_f64()
            ));
        }
        Ok(())
    }
}

/// The batch limits in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    pub max_batch: usize,
    pub max_delay: Duration,
}

/// How the batches handed out since the last observation filled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchFill {
    pub batches: u64,
    pub images: u64,
}

impl BatchFill {
    fn mean(&self) -> f64 {
        if self.batches == 0 {
            0.0
        } else {
            self.images as f64 / self.batches as f64
        }
    }
}

/// Fewest answers in a window before the controller trusts its P99.
const MIN_SAMPLES: u64 = 20;
/// Grow only while P99 is under this share of the objective: room for the larger batch.
const GROW_BELOW: f64 = 0.7;
/// Batches count as full when they average this share of the limit.
const FULL_SHARE: f64 = 0.9;

/// Why the limits changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// P99 breached the objective with batches part full: halved.
    Breach,
    /// P99 breached the objective with batches full: grown, to serve the backlog.
    Backlog,
    /// P99 well under and batches full: grown.
    Headroom,
}

impl Change {
    /// The metric label and log word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Breach => "breach",
            Self::Backlog => "backlog",
            Self::Headroom => "headroom",
        }
    }
}

#[derive(Debug, Clone)]
pub struct AdaptiveBatcher {
    objective: Duration,
    hold: Duration,
    /// Batch sizes the limit may take, ascending, ending at the configured `max_batch`.
    sizes: Vec<usize>,
    ceiling_delay: Duration,
    current: BatchLimits,
    hold_until: Option<Instant>,
}

impl AdaptiveBatcher {
    /// `ceiling` is the configured policy; `sizes` the batch sizes the instances run (their
    /// padded sizes), of which those up to the ceiling's `max_batch` are allowed limits.
    pub fn new(objective: &Objective, ceiling: BatchLimits, sizes: &[usize]) -> Self {
        let max = ceiling.max_batch.max(1);
        let mut allowed: Vec<usize> = sizes.iter().copied().filter(|&s| s >= 1 && s <= max).collect();
        allowed.extend([1, max]);
        allowed.sort_unstable();
        allowed.dedup();
        Self {
            objective: objective.p99,
            hold: objective.window,
            sizes: allowed,
            ceiling_delay: ceiling.max_delay,
            current: BatchLimits {
                max_batch: max,
                max_delay: ceiling.max_delay,
            },
            hold_until: None,
        }
    }

    pub fn limits(&self) -> BatchLimits {
        self.current
    }

    /// Judges the window ending at `now`; returns the new limits when they change.
    pub fn observe(
        &mut self,
        window: &WindowStats,
        fill: BatchFill,
        now: Instant,
    ) -> Option<(BatchLimits, Change)> {
        if window.answered < MIN_SAMPLES {
            return None;
        }
        let before = self.current;
        let full = fill.mean() >= FULL_SHARE * self.current.max_batch as f64;
        let held = self.hold_until.is_some_and(|t| now < t);
        let change = if window.p99 > self.objective && full {
            // A backlog cannot wait out a hold: requests pile up meanwhile. The fill is
            // measured since the last tick, not over the window, so it is current. Full
            // batches hardly wait for the delay: only the size matters.
            self.current.max_batch = self.ceiling();
            Change::Backlog
        } else if held {
            return None;
        } else if window.p99 > self.objective {
            self.shrink(fill.mean());
            Change::Breach
        } else if window.p99.as_secs_f64() < GROW_BELOW * self.objective.as_secs_f64() && full {
            self.grow();
            Change::Headroom
        } else {
            return None;
        };
        if self.current == before {
            return None;
        }
        self.hold_until = Some(now + self.hold);
        Some((self.current, change))
    }

    fn ceiling(&self) -> usize {
        self.sizes.last().copied().unwrap_or(1)
    }

    /// Halves the limit (to an allowed size), but not below the smallest allowed size that
    /// holds the batches the load fills (`mean_fill`): a limit under that would turn the
    /// breach into a backlog. Halves the delay.
    fn shrink(&mut self, mean_fill: f64) {
        let half = self.current.max_batch / 2;
        let halved = self
            .sizes
            .iter()
            .copied()
            .filter(|&s| s <= half.max(1))
            .max()
            .unwrap_or(1);
        let needed = self
            .sizes
            .iter()
            .copied()
            .find(|&s| s as f64 >= mean_fill.ceil())
            .unwrap_or(self.current.max_batch);
        self.current.max_batch = halved.max(needed).min(self.current.max_batch);
        self.current.max_delay /= 2;
        if self.current.max_delay < Duration::from_micros(50) {
            self.current.max_delay = Duration::ZERO;
        }
    }

    fn grow(&mut self) {
        if let Some(next) = self.sizes.iter().copied().find(|&s| s > self.current.max_batch) {
            self.current.max_batch = next;
        }
        let step = self.ceiling_delay / 4;
        self.current.max_delay = (self.current.max_delay + step).min(self.ceiling_delay);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const S: Duration = Duration::from_secs(1);

    fn batcher(max_batch: usize, delay: Duration, sizes: &[usize]) -> AdaptiveBatcher {
        let objective = Objective {
            p99: 50 * MS,
            window: 10 * S,
            adaptive_batching: true,
        };
        AdaptiveBatcher::new(
            &objective,
            BatchLimits {
                max_batch,
                max_delay: delay,
            },
            sizes,
        )
    }

    fn window(p99: Duration, answered: u64) -> WindowStats {
        WindowStats {
            answered,
            p99,
            ..WindowStats::default()
        }
    }

    fn full(size: u64) -> BatchFill {
        BatchFill {
            batches: 10,
            images: 10 * size,
        }
    }

    /// Batches half the size of `limit` (at least one image each): not full.
    fn part(limit: u64) -> BatchFill {
        BatchFill {
            batches: 10,
            images: 5 * limit.max(1),
        }
    }

    #[test]
    fn a_breach_halves_and_then_holds_for_a_window() {
        let t0 = Instant::now();
        let mut b = batcher(8, MS / 5, &[1, 2, 4, 8]);
        let (limits, why) = b.observe(&window(80 * MS, 100), part(8), t0).unwrap();
        assert_eq!(why, Change::Breach);
        assert_eq!(
            limits,
            BatchLimits {
                max_batch: 4,
                max_delay: MS / 10
            }
        );
        // The same breach, still in the window measured under the old limits: no change.
        assert_eq!(b.observe(&window(80 * MS, 100), part(4), t0 + 9 * S), None);
        let (limits, _) = b.observe(&window(80 * MS, 100), part(4), t0 + 10 * S).unwrap();
        assert_eq!(limits.max_batch, 2);
        let (limits, _) = b.observe(&window(80 * MS, 100), part(2), t0 + 20 * S).unwrap();
        assert_eq!(
            limits,
            BatchLimits {
                max_batch: 1,
                max_delay: Duration::ZERO
            }
        );
        // At the floor a breach changes nothing (and does not start a hold).
        assert_eq!(b.observe(&window(80 * MS, 100), part(1), t0 + 30 * S), None);
    }

    #[test]
    fn a_breach_with_full_batches_is_a_backlog_and_grows_the_limit_up_to_the_ceiling() {
        let t0 = Instant::now();
        let mut b = batcher(8, MS, &[1, 2, 4, 8]);
        let (limits, _) = b.observe(&window(80 * MS, 100), part(8), t0).unwrap();
        assert_eq!(limits.max_batch, 4);
        // Now the load fills batches of four and P99 is still over: bigger batches serve
        // more images a second, smaller ones fewer.
        // It does not wait out the hold, and goes back to the ceiling at once.
        let (limits, why) = b.observe(&window(80 * MS, 100), full(4), t0 + S).unwrap();
        assert_eq!((limits.max_batch, why), (8, Change::Backlog));
        // At the ceiling nothing is left to grow: no change (the 429s are the answer).
        assert_eq!(b.observe(&window(80 * MS, 100), full(8), t0 + 20 * S), None);
        let mut b = batcher(8, MS, &[1, 2, 4, 8]);
        b.observe(&window(80 * MS, 100), full(1), t0).unwrap();
        b.observe(&window(80 * MS, 100), full(1), t0 + 10 * S).unwrap();
        assert_eq!(b.limits().max_batch, 2);
        let (limits, _) = b.observe(&window(80 * MS, 100), full(2), t0 + 11 * S).unwrap();
        assert_eq!(limits.max_batch, 8, "from 2 straight to 8");
    }

    #[test]
    fn a_breach_never_shrinks_the_limit_below_what_the_load_fills() {
        let t0 = Instant::now();
        let mut b = batcher(8, MS, &[1, 2, 4, 8]);
        // Batches of five on average: a limit of four would leave a backlog behind.
        let five = BatchFill {
            batches: 10,
            images: 50,
        };
        let (limits, why) = b.observe(&window(80 * MS, 100), five, t0).unwrap();
        assert_eq!(
            (limits.max_batch, limits.max_delay, why),
            (8, MS / 2, Change::Breach)
        );
        let three = BatchFill {
            batches: 10,
            images: 30,
        };
        let (limits, _) = b.observe(&window(80 * MS, 100), three, t0 + 10 * S).unwrap();
        assert_eq!(limits.max_batch, 4);
    }

    #[test]
    fn grows_one_allowed_size_at_a_time_up_to_the_ceiling_only_when_batches_are_full() {
        let t0 = Instant::now();
        let mut b = batcher(8, 4 * MS, &[1, 2, 4, 8, 16]);
        for (i, want) in [4, 2, 1].into_iter().enumerate() {
            let at = t0 + (i as u32) * 10 * S;
            assert_eq!(
                b.observe(&window(90 * MS, 50), part(b.limits().max_batch as u64), at)
                    .unwrap()
                    .0
                    .max_batch,
                want
            );
        }
        let mut at = t0 + 30 * S;
        // Under the objective but batches half empty: the load, not the limit, sets them.
        assert_eq!(
            b.observe(
                &window(10 * MS, 50),
                BatchFill {
                    batches: 10,
                    images: 5
                },
                at
            ),
            None
        );
        for want in [2, 4, 8] {
            let (limits, why) = b
                .observe(&window(10 * MS, 50), full(b.limits().max_batch as u64), at)
                .unwrap();
            assert_eq!((limits.max_batch, why), (want, Change::Headroom));
            at += 10 * S;
        }
        // Halved thrice (0.5 ms), then a quarter of the ceiling back per step.
        assert_eq!(
            b.limits().max_delay,
            3 * MS + MS / 2,
            "a quarter of the ceiling back per step"
        );
        // The delay comes back to its ceiling; 16 is a padded size but above the configured
        // max_batch: never reached.
        let (limits, _) = b.observe(&window(10 * MS, 50), full(8), at).unwrap();
        assert_eq!((limits.max_batch, limits.max_delay), (8, 4 * MS));
        assert_eq!(b.observe(&window(10 * MS, 50), full(8), at + 10 * S), None);
    }

    #[test]
    fn the_band_between_70_and_100_percent_keeps_the_limits() {
        let t0 = Instant::now();
        let mut b = batcher(8, MS, &[]);
        assert_eq!(b.observe(&window(40 * MS, 100), full(8), t0), None);
        assert_eq!(
            b.observe(&window(50 * MS, 100), full(8), t0),
            None,
            "at the objective is not a breach"
        );
        assert_eq!(b.limits().max_batch, 8);
    }

    #[test]
    fn too_few_samples_are_not_judged() {
        let t0 = Instant::now();
        let mut b = batcher(8, MS, &[]);
        assert_eq!(b.observe(&window(500 * MS, 19), part(8), t0), None);
        assert!(b.observe(&window(500 * MS, 20), part(8), t0).is_some());
    }

    #[test]
    fn sizes_that_are_not_padded_sizes_are_skipped() {
        let t0 = Instant::now();
        // Sessions padded to 1, 4 and 12: halving 12 gives 6, which snaps down to 4 (the
        // load fills batches of one).
        let mut b = batcher(12, MS, &[1, 4, 12]);
        assert_eq!(
            b.observe(&window(90 * MS, 50), full(1), t0).unwrap().0.max_batch,
            4
        );
        assert_eq!(
            b.observe(&window(90 * MS, 50), full(1), t0 + 10 * S)
                .unwrap()
                .0
                .max_batch,
            1
        );
        assert_eq!(
            b.observe(&window(1 * MS, 50), full(1), t0 + 20 * S)
                .unwrap()
                .0
                .max_batch,
            4
        );
        assert_eq!(
            b.observe(&window(1 * MS, 50), full(4), t0 + 30 * S)
                .unwrap()
                .0
                .max_batch,
            12
        );
    }

    #[test]
    fn objective_validation_names_the_setting() {
        let mut o = Objective {
            p99: Duration::ZERO,
            window: 10 * S,
            adaptive_batching: true,
        };
        assert!(o.validate().unwrap_err().contains("P99"));
        o.p99 = MS;
        o.window = MS;
        assert!(o.validate().unwrap_err().contains("window"));
        o.window = 10 * S;
        assert!(o.validate().is_ok());
    }
}

//! Latency over a sliding window, as plain state: no clock of its own. The engine records
//! every answered request (end to end inside the engine: waiting for a decoder, decoding,
//! queueing, the batch's run and postprocessing) and every failure; the queue task reads
//! the window's P99 to steer batching against the model's objective.
//!
//! The window is cut into slices, each an HDR histogram (2 significant digits, 1 µs to
//! 60 s); a slice older than the window is cleared when its turn comes round again, so a
//! load spike leaves the window one window after it ended, and nothing is averaged.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Slices a window is cut into: the window moves in steps of a tenth of its length.
const SLICES: u32 = 10;
/// Longest latency a histogram holds, in microseconds; longer ones count as this.
const MAX_MICROS: u64 = 60_000_000;

/// What one window holds, as of one instant.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct WindowStats {
    /// Requests answered with a result.
    pub answered: u64,
    /// Requests that failed inside the engine (inference errors, deadlines passed).
    pub failed: u64,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    /// How much time the window covers (less than its length until it has run that long).
    pub covered: Duration,
}

impl WindowStats {
    /// Answered requests per second over the covered time.
    pub fn throughput(&self) -> f64 {
        let secs = self.covered.as_secs_f64();
        if secs > 0.0 {
            self.answered as f64 / secs
        } else {
            0.0
        }
    }

    /// Failed requests as a share of all that ended (0 when none did).
    pub fn error_rate(&self) -> f64 {
        let all = self.answered + self.failed;
        if all == 0 {
            0.0
        } else {
            self.failed as f64 / all as f64
        }
    }
}

struct Slice {
    /// Which slice of time since `origin` this holds; stale when older than the window.
    index: u64,
    latencies: Histogram<u64>,
    failed: u64,
}

/// A sliding window of request latencies.
pub struct LatencyWindow {
    origin: Instant,
    slice_len: Duration,
    slices: Vec<Slice>,
}

impl std::fmt::Debug for LatencyWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyWindow")
            .field("length", &(self.slice_len * SLICES))
            .finish_non_exhaustive()
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_MICROS, 2).expect("the bounds are valid")
}

impl LatencyWindow {
    /// A window of `length` (at least 10 ms) starting at `now`.
    pub fn new(length: Duration, now: Instant) -> Self {
        let slice_len = (length / SLICES).max(Duration::from_millis(1));
        Self {
            origin: now,
            slice_len,
            slices: (0..SLICES)
                .map(|_| Slice {
                    index: u64::MAX,
                    latencies: histogram(),
                    failed: 0,
                })
                .collect(),
        }
    }

    pub fn length(&self) -> Duration {
        self.slice_len * SLICES
    }

    fn index_at(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.origin);
        (since.as_nanos() / self.slice_len.as_nanos().max(1)) as u64
    }

    /// The slice `now` falls in, cleared first if it still holds an older turn.
    fn slice(&mut self, now: Instant) -> &mut Slice {
        let index = self.index_at(now);
        let slice = &mut self.slices[(index % u64::from(SLICES)) as usize];
        if slice.index != index {
            slice.index = index;
            slice.latencies.reset();
            slice.failed = 0;
        }
        slice
    }

    /// A request answered at `now` after `latency`.
    pub fn answered(&mut self, latency: Duration, now: Instant) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.slice(now)
            .latencies
            .saturating_record(micros.clamp(1, MAX_MICROS));
    }

    /// A request that failed inside the engine at `now`.
    pub fn failed(&mut self, now: Instant) {
        self.slice(now).failed += 1;
    }

    /// The window ending at `now`: the current slice and the nine before it.
    pub fn stats(&self, now: Instant) -> WindowStats {
        let current = self.index_at(now);
        let oldest = current.saturating_sub(u64::from(SLICES) - 1);
        let mut merged = histogram();
        let mut failed = 0;
        for s in &self.slices {
            if s.index != u64::MAX && (oldest..=current).contains(&s.index) {
                merged.add(&s.latencies).expect("same bounds");
                failed += s.failed;
            }
        }
        let micros = |q: f64| Duration::from_micros(merged.value_at_quantile(q));
        let (p50, p99, max) = if merged.is_empty() {
            Default::default()
        } else {
            (micros(0.5), micros(0.99), Duration::from_micros(merged.max()))
        };
        WindowStats {
            answered: merged.len(),
            failed,
            p50,
            p99,
            max,
            covered: now.saturating_duration_since(self.origin).min(self.length()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn p99_is_a_quantile_not_a_mean() {
        let t0 = Instant::now();
        let mut w = LatencyWindow::new(Duration::from_secs(10), t0);
        for i in 0..1000 {
            // 1% of requests take 200 ms, the rest 10 ms.
            let latency = if i % 100 == 99 { 200 * MS } else { 10 * MS };
            w.answered(latency, t0 + i * MS);
        }
        let s = w.stats(t0 + Duration::from_secs(1));
        assert_eq!(s.answered, 1000);
        // hdrhistogram at 2 significant digits: within 1%.
        assert!(s.p50.abs_diff(10 * MS) <= MS / 10, "{:?}", s.p50);
        assert!(
            s.p99.abs_diff(10 * MS) <= MS / 10,
            "p99 is the 990th value: {:?}",
            s.p99
        );
        assert!(s.max.abs_diff(200 * MS) <= 2 * MS, "{:?}", s.max);
        for i in 0..10 {
            w.answered(200 * MS, t0 + Duration::from_secs(1) + i * MS);
        }
        let s = w.stats(t0 + Duration::from_secs(1));
        assert!(s.p99.abs_diff(200 * MS) <= 2 * MS, "2% slow now: {:?}", s.p99);
    }

    #[test]
    fn old_slices_leave_the_window() {
        let t0 = Instant::now();
        let mut w = LatencyWindow::new(Duration::from_secs(10), t0);
        w.answered(500 * MS, t0);
        w.failed(t0);
        w.answered(5 * MS, t0 + Duration::from_secs(9));
        let s = w.stats(t0 + Duration::from_millis(9_500));
        assert_eq!((s.answered, s.failed), (2, 1));
        assert!(s.p99 >= 490 * MS);
        // Ten seconds on, the first slice has left; the later one stays until 19 s.
        let s = w.stats(t0 + Duration::from_secs(10));
        assert_eq!((s.answered, s.failed), (1, 0));
        assert!(s.p99 < 6 * MS);
        let s = w.stats(t0 + Duration::from_secs(19));
        assert_eq!(s.answered, 0);
        assert_eq!(s.p99, Duration::ZERO);
    }

    #[test]
    fn a_slice_reused_a_turn_later_starts_empty() {
        let t0 = Instant::now();
        let mut w = LatencyWindow::new(Duration::from_secs(1), t0);
        w.answered(50 * MS, t0);
        // 1 s later the same ring position comes round: the old sample must not count.
        w.answered(5 * MS, t0 + Duration::from_secs(1));
        let s = w.stats(t0 + Duration::from_secs(1));
        assert_eq!(s.answered, 1);
        assert!(s.max < 6 * MS);
    }

    #[test]
    fn rates_over_the_covered_time() {
        let t0 = Instant::now();
        let mut w = LatencyWindow::new(Duration::from_secs(10), t0);
        for i in 0..40 {
            w.answered(MS, t0 + i * 50 * MS);
        }
        w.failed(t0 + Duration::from_secs(1));
        let s = w.stats(t0 + Duration::from_secs(2));
        assert_eq!(s.covered, Duration::from_secs(2));
        assert!((s.throughput() - 20.0).abs() < 1e-9);
        assert!((s.error_rate() - 1.0 / 41.0).abs() < 1e-9);
        assert_eq!(WindowStats::default().error_rate(), 0.0);
    }
}

//! Per-engine statistics in the shape Triton's statistics extension reports: cumulative
//! counts and nanoseconds per stage, per request and per batch size. Lock-free counters
//! written by the instance threads and the request futures, read as a [`StatsSnapshot`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A count of events and their summed duration.
#[derive(Debug, Default)]
struct DurationCounter {
    count: AtomicU64,
    ns: AtomicU64,
}

impl DurationCounter {
    fn add(&self, n: u64, d: Duration) {
        self.count.fetch_add(n, Ordering::Relaxed);
        self.ns
            .fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn get(&self) -> StageTotal {
        StageTotal {
            count: self.count.load(Ordering::Relaxed),
            ns: self.ns.load(Ordering::Relaxed),
        }
    }
}

/// Cumulative count and nanoseconds of one stage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageTotal {
    pub count: u64,
    pub ns: u64,
}

#[derive(Debug, Default)]
struct BatchCounters {
    compute_input: DurationCounter,
    compute_infer: DurationCounter,
    compute_output: DurationCounter,
}

/// Totals for the batches of one size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchTotals {
    pub batch_size: usize,
    pub compute_input: StageTotal,
    pub compute_infer: StageTotal,
    pub compute_output: StageTotal,
}

/// Everything an engine has counted since it started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Milliseconds since the Unix epoch of the last batch, 0 if none ran.
    pub last_inference_ms: u64,
    /// Images (batch slots) computed.
    pub inference_count: u64,
    /// Batches run.
    pub execution_count: u64,
    /// Items answered with a result, and their time from submission to answer.
    pub success: StageTotal,
    /// Items that failed after admission, and their time.
    pub fail: StageTotal,
    pub queue: StageTotal,
    /// Decoding, letterboxing and normalisation (or the tensor copy), per item.
    pub compute_input: StageTotal,
    pub compute_infer: StageTotal,
    pub compute_output: StageTotal,
    /// Only batch sizes that ran.
    pub batches: Vec<BatchTotals>,
}

#[derive(Debug)]
pub(crate) struct EngineStats {
    last_inference_ms: AtomicU64,
    inference_count: AtomicU64,
    execution_count: AtomicU64,
    success: DurationCounter,
    fail: DurationCounter,
    queue: DurationCounter,
    compute_input: DurationCounter,
    compute_infer: DurationCounter,
    compute_output: DurationCounter,
    /// Index `size - 1`.
    batches: Vec<BatchCounters>,
}

/// One batch as the instance thread saw it.
pub(crate) struct BatchRun {
    pub size: usize,
    /// Per item: normalisation or tensor copy; the item's own decode is added separately.
    pub input: Duration,
    pub infer: Duration,
    pub output: Duration,
}

impl EngineStats {
    pub fn new(max_batch: usize) -> Self {
        Self {
            last_inference_ms: AtomicU64::new(0),
            inference_count: AtomicU64::new(0),
            execution_count: AtomicU64::new(0),
            success: DurationCounter::default(),
            fail: DurationCounter::default(),
            queue: DurationCounter::default(),
            compute_input: DurationCounter::default(),
            compute_infer: DurationCounter::default(),
            compute_output: DurationCounter::default(),
            batches: (0..max_batch.max(1)).map(|_| BatchCounters::default()).collect(),
        }
    }

    pub fn batch(&self, run: &BatchRun, decode_total: Duration) {
        let n = run.size as u64;
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.last_inference_ms.store(now_ms, Ordering::Relaxed);
        self.inference_count.fetch_add(n, Ordering::Relaxed);
        self.execution_count.fetch_add(1, Ordering::Relaxed);
        // Triton charges each request in a batch the whole batch's compute time.
        self.compute_input
            .add(n, run.input * run.size as u32 + decode_total);
        self.compute_infer.add(n, run.infer * run.size as u32);
        self.compute_output.add(n, run.output * run.size as u32);
        if let Some(b) = self.batches.get(run.size.wrapping_sub(1)) {
            b.compute_input.add(1, run.input);
            b.compute_infer.add(1, run.infer);
            b.compute_output.add(1, run.output);
        }
    }

    pub fn queued(&self, waited: Duration) {
        self.queue.add(1, waited);
    }

    pub fn finished(&self, ok: bool, took: Duration) {
        if ok {
            self.success.add(1, took);
        } else {
            self.fail.add(1, took);
        }
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            last_inference_ms: self.last_inference_ms.load(Ordering::Relaxed),
            inference_count: self.inference_count.load(Ordering::Relaxed),
            execution_count: self.execution_count.load(Ordering::Relaxed),
            success: self.success.get(),
            fail: self.fail.get(),
            queue: self.queue.get(),
            compute_input: self.compute_input.get(),
            compute_infer: self.compute_infer.get(),
            compute_output: self.compute_output.get(),
            batches: self
                .batches
                .iter()
                .enumerate()
                .map(|(i, b)| BatchTotals {
                    batch_size: i + 1,
                    compute_input: b.compute_input.get(),
                    compute_infer: b.compute_infer.get(),
                    compute_output: b.compute_output.get(),
                })
                .filter(|b| b.compute_infer.count > 0)
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_charge_every_item_and_count_per_size() {
        let s = EngineStats::new(4);
        let ms = Duration::from_millis;
        s.batch(
            &BatchRun {
                size: 2,
                input: ms(1),
                infer: ms(10),
                output: ms(2),
            },
            ms(6),
        );
        s.queued(ms(3));
        s.finished(true, ms(20));
        s.finished(false, ms(5));
        let snap = s.snapshot();
        assert_eq!((snap.inference_count, snap.execution_count), (2, 1));
        assert_eq!(
            snap.compute_infer,
            StageTotal {
                count: 2,
                ns: 20_000_000
            }
        );
        assert_eq!(
            snap.compute_input.ns, 8_000_000,
            "2 x 1 ms normalise + 6 ms decode"
        );
        assert_eq!(snap.batches.len(), 1);
        assert_eq!(snap.batches[0].batch_size, 2);
        assert_eq!(snap.batches[0].compute_infer.ns, 10_000_000);
        assert_eq!((snap.success.count, snap.fail.count), (1, 1));
        assert!(snap.last_inference_ms > 0);
    }
}

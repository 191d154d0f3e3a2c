//! What the store has done, counted where it happens (the handle counts what it refuses,
//! the writer what it commits), read as one [`StoreStats`] for metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The store's counters since it opened, and the last thing that went wrong.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Events committed to the database.
    pub written: u64,
    /// Writes `record` and `attach_snapshot` dropped because the queue was full or the
    /// writer had stopped.
    pub dropped: u64,
    /// Writes refused as wrong: invalid events, a second event with an id already stored,
    /// a snapshot for an event the store does not have.
    pub rejected: u64,
    /// Events lost because their transaction failed (disk full, I/O error).
    pub failed: u64,
    /// Writes waiting in the queue now.
    pub queued: usize,
    /// Events removed by retention.
    pub removed_by_retention: u64,
    /// Snapshot files deleted (with their event, by retention, or replaced).
    pub snapshots_deleted: u64,
    /// The last error the writer met (a failed commit, a snapshot it could not read or
    /// delete), if any.
    pub last_error: Option<String>,
}

/// The live counters behind [`StoreStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) written: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) removed_by_retention: AtomicU64,
    pub(crate) snapshots_deleted: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn set_last_error(&self, error: String) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(error);
    }

    pub(crate) fn read(&self, queued: usize) -> StoreStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        StoreStats {
            written: load(&self.written),
            dropped: load(&self.dropped),
            rejected: load(&self.rejected),
            failed: load(&self.failed),
            queued,
            removed_by_retention: load(&self.removed_by_retention),
            snapshots_deleted: load(&self.snapshots_deleted),
            last_error: self
                .last_error
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone(),
        }
    }
}

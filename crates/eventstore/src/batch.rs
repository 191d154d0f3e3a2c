//! The writer's decisions about time, as plain state: when the pending batch must be
//! committed ([`PendingBatch`]) and when retention runs next ([`Periodic`]). The writer
//! thread passes `now` in; nothing here reads a clock or touches a channel.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::event::NewEvent;

/// A write that waits in the batch for the next transaction.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Write {
    Insert(NewEvent),
    AttachSnapshot { id: String, path: PathBuf },
}

/// Writes taken from the queue but not yet committed, in arrival order.
#[derive(Debug)]
pub(crate) struct PendingBatch {
    writes: Vec<Write>,
    oldest_at: Option<Instant>,
    max_writes: usize,
    max_wait: Duration,
}

impl PendingBatch {
    /// A batch committed once it holds `max_writes`, or `max_wait` after its oldest write.
    pub(crate) fn new(max_writes: usize, max_wait: Duration) -> Self {
        Self {
            writes: Vec::with_capacity(max_writes),
            oldest_at: None,
            max_writes,
            max_wait,
        }
    }

    pub(crate) fn push(&mut self, write: Write, now: Instant) {
        self.oldest_at.get_or_insert(now);
        self.writes.push(write);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// When the batch must be committed: `None` while it is empty; at once when full.
    pub(crate) fn due_at(&self) -> Option<Instant> {
        let oldest_at = self.oldest_at?;
        if self.writes.len() >= self.max_writes {
            Some(oldest_at)
        } else {
            Some(oldest_at + self.max_wait)
        }
    }

    pub(crate) fn is_due(&self, now: Instant) -> bool {
        self.due_at().is_some_and(|due| due <= now)
    }

    /// The writes, oldest first, leaving the batch empty.
    pub(crate) fn take(&mut self) -> Vec<Write> {
        self.oldest_at = None;
        std::mem::replace(&mut self.writes, Vec::with_capacity(self.max_writes))
    }
}

/// Something that runs every `every`, first at `first_at`.
#[derive(Debug)]
pub(crate) struct Periodic {
    next_at: Instant,
    every: Duration,
}

impl Periodic {
    pub(crate) fn new(first_at: Instant, every: Duration) -> Self {
        Self {
            next_at: first_at,
            every,
        }
    }

    pub(crate) fn next_at(&self) -> Instant {
        self.next_at
    }

    pub(crate) fn is_due(&self, now: Instant) -> bool {
        self.next_at <= now
    }

    /// It ran at `now` (on schedule or asked for): the next run is a full period later.
    pub(crate) fn ran(&mut self, now: Instant) {
        // A period too long for the clock's range means "not again for a long while".
        const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
        self.next_at = now.checked_add(self.every).unwrap_or(now + FAR);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attach(n: usize) -> Write {
        Write::AttachSnapshot {
            id: n.to_string(),
            path: PathBuf::from(format!("{n}.jpg")),
        }
    }

    #[test]
    fn a_batch_is_due_max_wait_after_its_oldest_write_not_its_newest() {
        let t0 = Instant::now();
        let wait = Duration::from_millis(200);
        let mut batch = PendingBatch::new(10, wait);
        assert_eq!(batch.due_at(), None);
        assert!(
            !batch.is_due(t0 + Duration::from_secs(3600)),
            "an empty batch is never due"
        );
        batch.push(attach(0), t0);
        batch.push(attach(1), t0 + Duration::from_millis(150));
        assert_eq!(batch.due_at(), Some(t0 + wait));
        assert!(!batch.is_due(t0 + Duration::from_millis(199)));
        assert!(batch.is_due(t0 + wait));
        assert_eq!(batch.take(), vec![attach(0), attach(1)], "in arrival order");
        assert!(batch.is_empty());
        assert_eq!(batch.due_at(), None, "taking resets the clock");
        batch.push(attach(2), t0 + Duration::from_secs(5));
        assert_eq!(batch.due_at(), Some(t0 + Duration::from_secs(5) + wait));
    }

    #[test]
    fn a_full_batch_is_due_at_once() {
        let t0 = Instant::now();
        let mut batch = PendingBatch::new(3, Duration::from_secs(1));
        for n in 0..2 {
            batch.push(attach(n), t0);
        }
        assert!(!batch.is_due(t0));
        batch.push(attach(2), t0);
        assert!(batch.is_due(t0));
    }

    #[test]
    fn a_periodic_task_is_due_from_its_first_time_and_then_a_period_after_each_run() {
        let t0 = Instant::now();
        let every = Duration::from_secs(60);
        let mut retention = Periodic::new(t0, every);
        assert!(retention.is_due(t0), "runs at once");
        retention.ran(t0 + Duration::from_secs(2));
        assert_eq!(retention.next_at(), t0 + Duration::from_secs(62));
        assert!(!retention.is_due(t0 + Duration::from_secs(61)));
        assert!(retention.is_due(t0 + Duration::from_secs(62)));
        let mut never = Periodic::new(t0, Duration::MAX);
        never.ran(t0);
        assert!(!never.is_due(t0 + Duration::from_secs(10 * 365 * 24 * 3600)));
    }
}

//! The batching decision, as plain state: no channels, no clock of its own.
//!
//! The queue task owns one [`BatchQueue`] and asks it, whenever a model instance is idle,
//! what to run next. Everything that decides *which* requests form a batch and *when*
//! lives here, tested with explicit instants.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How requests are grouped into batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchPolicy {
    /// Most requests in one batch.
    pub max_batch: usize,
    /// Longest the oldest request waits for company before a smaller batch is run.
    pub max_delay: Duration,
    /// Batch sizes the model runs best at; a partial batch is cut to the largest of these
    /// that fits, unless that would leave the oldest request waiting past `max_delay`.
    pub preferred: Vec<usize>,
    /// Most requests waiting; beyond it new ones are refused.
    pub capacity: usize,
}

/// What a queued item must tell the queue about itself.
pub trait QueueItem {
    /// When the caller stops waiting for an answer.
    fn deadline(&self) -> Instant;
    /// True once nobody is waiting for the answer (the client went away).
    fn is_abandoned(&self) -> bool;
}

struct Waiting<T> {
    item: T,
    enqueued: Instant,
}

/// What the queue says to an idle model instance.
#[derive(Debug)]
pub enum NextBatch<T> {
    /// Run these now, oldest first.
    Run(Vec<(T, Duration)>),
    /// Nothing is ready; ask again at this instant (or when a request arrives).
    WaitUntil(Instant),
    /// Nothing queued.
    Empty,
}

/// Requests removed without being run, to be answered by the caller.
#[derive(Debug)]
pub struct Dropped<T> {
    pub expired: Vec<T>,
    pub abandoned: Vec<T>,
}

impl<T> Default for Dropped<T> {
    fn default() -> Self {
        Self {
            expired: Vec::new(),
            abandoned: Vec::new(),
        }
    }
}

pub struct BatchQueue<T> {
    policy: BatchPolicy,
    waiting: VecDeque<Waiting<T>>,
}

impl<T: QueueItem> BatchQueue<T> {
    pub fn new(policy: BatchPolicy) -> Self {
        Self {
            waiting: VecDeque::with_capacity(policy.capacity),
            policy,
        }
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// The policy in force.
    pub fn policy(&self) -> &BatchPolicy {
        &self.policy
    }

    /// Changes the batch limit and delay from the next batch on (adaptive batching);
    /// requests already waiting keep their place.
    pub fn set_limits(&mut self, max_batch: usize, max_delay: Duration) {
        self.policy.max_batch = max_batch.max(1);
        self.policy.max_delay = max_delay;
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Adds a request; gives it back when the queue is full.
    pub fn push(&mut self, item: T, now: Instant) -> Result<(), T> {
        if self.waiting.len() >= self.policy.capacity {
            return Err(item);
        }
        self.waiting.push_back(Waiting { item, enqueued: now });
        Ok(())
    }

    /// Puts items back at the head of the queue, in their order, whatever the capacity:
    /// they were admitted and queued once already (a batch whose device failed under it).
    pub fn requeue(&mut self, items: Vec<T>, now: Instant) {
        for item in items.into_iter().rev() {
            self.waiting.push_front(Waiting { item, enqueued: now });
        }
    }

    /// Removes every request past its deadline or abandoned by its client, so no compute
    /// is spent on them.
    pub fn sweep(&mut self, now: Instant, dropped: &mut Dropped<T>) {
        let mut i = 0;
        while i < self.waiting.len() {
            let w = &self.waiting[i];
            if w.item.is_abandoned() {
                let w = self.waiting.remove(i).expect("index is in range");
                dropped.abandoned.push(w.item);
            } else if w.item.deadline() <= now {
                let w = self.waiting.remove(i).expect("index is in range");
                dropped.expired.push(w.item);
            } else {
                i += 1;
            }
        }
    }

    /// Decides the next batch for an idle model instance. Sweeps first, so a returned
    /// batch holds only live requests. Each item comes with the time it waited.
    pub fn next_batch(&mut self, now: Instant, dropped: &mut Dropped<T>) -> NextBatch<T> {
        self.sweep(now, dropped);
        let Some(oldest) = self.waiting.front() else {
            return NextBatch::Empty;
        };
        let max = self.policy.max_batch.max(1);
        let n = self.waiting.len();
        let due = oldest.enqueued + self.policy.max_delay;
        let take = if n >= max {
            max
        } else if now >= due {
            // The oldest has waited long enough: run what there is, trimmed to a preferred
            // size when one fits (the rest go in the next batch, right after).
            self.policy
                .preferred
                .iter()
                .copied()
                .filter(|&p| p >= 1 && p <= n)
                .max()
                .unwrap_or(n)
        } else {
            return NextBatch::WaitUntil(due);
        };
        let batch = self
            .waiting
            .drain(..take)
            .map(|w| {
                let waited = now.saturating_duration_since(w.enqueued);
                (w.item, waited)
            })
            .collect();
        NextBatch::Run(batch)
    }

    /// The soonest deadline among waiting requests: when the next sweep is due.
    pub fn earliest_deadline(&self) -> Option<Instant> {
        self.waiting.iter().map(|w| w.item.deadline()).min()
    }

    /// Empties the queue (shutdown); the caller answers each request.
    pub fn drain_all(&mut self) -> Vec<T> {
        self.waiting.drain(..).map(|w| w.item).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    #[derive(Debug)]
    struct Req {
        id: u32,
        deadline: Instant,
        abandoned: Rc<Cell<bool>>,
    }

    impl QueueItem for Req {
        fn deadline(&self) -> Instant {
            self.deadline
        }
        fn is_abandoned(&self) -> bool {
            self.abandoned.get()
        }
    }

    fn policy(max_batch: usize, delay_ms: u64, preferred: &[usize], capacity: usize) -> BatchPolicy {
        BatchPolicy {
            max_batch,
            max_delay: Duration::from_millis(delay_ms),
            preferred: preferred.to_vec(),
            capacity,
        }
    }

    fn req(id: u32, deadline: Instant) -> Req {
        Req {
            id,
            deadline,
            abandoned: Rc::new(Cell::new(false)),
        }
    }

    fn ids(b: NextBatch<Req>) -> Vec<u32> {
        match b {
            NextBatch::Run(v) => v.into_iter().map(|(r, _)| r.id).collect(),
            other => panic!("expected a batch, got {other:?}"),
        }
    }

    #[test]
    fn full_batch_runs_at_once() {
        let t0 = Instant::now();
        let far = t0 + Duration::from_secs(10);
        let mut q = BatchQueue::new(policy(2, 5, &[], 10));
        for i in 0..3 {
            q.push(req(i, far), t0).unwrap();
        }
        let mut d = Dropped::default();
        assert_eq!(ids(q.next_batch(t0, &mut d)), [0, 1]);
        // One left: it waits for the delay.
        assert!(
            matches!(q.next_batch(t0, &mut d), NextBatch::WaitUntil(t) if t == t0 + Duration::from_millis(5))
        );
        assert_eq!(ids(q.next_batch(t0 + Duration::from_millis(5), &mut d)), [2]);
        assert!(matches!(q.next_batch(t0, &mut d), NextBatch::Empty));
    }

    #[test]
    fn zero_delay_means_no_batching_wait() {
        let t0 = Instant::now();
        let mut q = BatchQueue::new(policy(8, 0, &[], 10));
        q.push(req(0, t0 + Duration::from_secs(1)), t0).unwrap();
        assert_eq!(ids(q.next_batch(t0, &mut Dropped::default())), [0]);
    }

    #[test]
    fn preferred_sizes_trim_a_partial_batch() {
        let t0 = Instant::now();
        let far = t0 + Duration::from_secs(10);
        let mut q = BatchQueue::new(policy(8, 1, &[2, 4], 10));
        for i in 0..5 {
            q.push(req(i, far), t0).unwrap();
        }
        let later = t0 + Duration::from_millis(1);
        let mut d = Dropped::default();
        assert_eq!(ids(q.next_batch(later, &mut d)), [0, 1, 2, 3]);
        // One left and no preferred size fits it: it runs alone.
        assert_eq!(ids(q.next_batch(later, &mut d)), [4]);
    }

    #[test]
    fn capacity_refuses_and_gives_the_item_back() {
        let t0 = Instant::now();
        let mut q = BatchQueue::new(policy(4, 1, &[], 2));
        q.push(req(0, t0), t0).unwrap();
        q.push(req(1, t0), t0).unwrap();
        let back = q.push(req(2, t0), t0).unwrap_err();
        assert_eq!(back.id, 2);
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn expired_and_abandoned_are_dropped_before_batching() {
        let t0 = Instant::now();
        let mut q = BatchQueue::new(policy(4, 0, &[], 10));
        let soon = t0 + Duration::from_millis(10);
        let far = t0 + Duration::from_secs(10);
        q.push(req(0, soon), t0).unwrap();
        let gone = req(1, far);
        let flag = gone.abandoned.clone();
        q.push(gone, t0).unwrap();
        q.push(req(2, far), t0).unwrap();
        flag.set(true);
        let mut d = Dropped::default();
        assert_eq!(ids(q.next_batch(t0 + Duration::from_millis(10), &mut d)), [2]);
        assert_eq!(d.expired.iter().map(|r| r.id).collect::<Vec<_>>(), [0]);
        assert_eq!(d.abandoned.iter().map(|r| r.id).collect::<Vec<_>>(), [1]);
    }

    #[test]
    fn new_limits_apply_from_the_next_batch() {
        let t0 = Instant::now();
        let far = t0 + Duration::from_secs(10);
        let mut q = BatchQueue::new(policy(8, 5, &[], 20));
        for i in 0..10 {
            q.push(req(i, far), t0).unwrap();
        }
        let mut d = Dropped::default();
        assert_eq!(ids(q.next_batch(t0, &mut d)).len(), 8);
        q.set_limits(1, Duration::ZERO);
        assert_eq!(ids(q.next_batch(t0, &mut d)), [8]);
        assert_eq!(ids(q.next_batch(t0, &mut d)), [9]);
        assert_eq!(q.policy().max_delay, Duration::ZERO);
    }

    #[test]
    fn waited_time_is_reported() {
        let t0 = Instant::now();
        let mut q = BatchQueue::new(policy(1, 0, &[], 10));
        q.push(req(0, t0 + Duration::from_secs(1)), t0).unwrap();
        match q.next_batch(t0 + Duration::from_millis(7), &mut Dropped::default()) {
            NextBatch::Run(v) => assert_eq!(v[0].1, Duration::from_millis(7)),
            other => panic!("{other:?}"),
        }
    }
}

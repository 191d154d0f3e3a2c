//! The hand-off between a stream's decode thread and its detection task: one slot, latest
//! frame wins. A detector slower than the camera sees the newest picture each time it asks,
//! and the pictures it never got to are dropped (and counted) instead of queueing up.

use std::sync::Mutex;

use tokio::sync::Notify;

/// A one-value mailbox. `put` never waits; it returns the value it displaced, if any.
#[derive(Debug)]
pub struct LatestSlot<T> {
    state: Mutex<SlotState<T>>,
    notify: Notify,
}

#[derive(Debug)]
struct SlotState<T> {
    value: Option<T>,
    closed: bool,
}

impl<T> Default for LatestSlot<T> {
    fn default() -> Self {
        Self {
            state: Mutex::new(SlotState {
                value: None,
                closed: false,
            }),
            notify: Notify::new(),
        }
    }
}

impl<T> LatestSlot<T> {
    /// Stores `value`, returning the older value it replaced (the caller counts that one as
    /// dropped). After `close`, the value is handed straight back.
    pub fn put(&self, value: T) -> Option<T> {
        let displaced = match self.state.lock() {
            Ok(mut s) if !s.closed => s.value.replace(value),
            _ => Some(value),
        };
        // One consumer: notify_one keeps a permit if it is not waiting right now.
        self.notify.notify_one();
        displaced
    }

    /// Waits for a value; `None` once the slot is closed and empty.
    pub async fn take(&self) -> Option<T> {
        loop {
            {
                let Ok(mut s) = self.state.lock() else { return None };
                if let Some(v) = s.value.take() {
                    return Some(v);
                }
                if s.closed {
                    return None;
                }
            }
            self.notify.notified().await;
        }
    }

    /// Wakes the consumer for good; a value still in the slot is dropped with the slot.
    pub fn close(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.closed = true;
            s.value = None;
        }
        self.notify.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn newest_value_wins_and_displaced_values_come_back() {
        let slot = LatestSlot::default();
        assert_eq!(slot.put(1), None);
        assert_eq!(slot.put(2), Some(1));
        assert_eq!(slot.put(3), Some(2));
        assert_eq!(slot.take().await, Some(3));
    }

    #[tokio::test]
    async fn take_waits_for_a_put_and_ends_on_close() {
        let slot = Arc::new(LatestSlot::default());
        let s = slot.clone();
        let waiter = tokio::spawn(async move { s.take().await });
        tokio::task::yield_now().await;
        slot.put(7);
        assert_eq!(waiter.await.unwrap(), Some(7));
        let s = slot.clone();
        let waiter = tokio::spawn(async move { s.take().await });
        tokio::task::yield_now().await;
        slot.close();
        assert_eq!(waiter.await.unwrap(), None);
        assert_eq!(slot.put(8), Some(8), "closed slot hands values back");
    }
}

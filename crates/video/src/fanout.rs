//! How results fan out: a bounded broadcast per stream and one for all streams (for SSE
//! and WebSocket handlers), plus each sink's own bounded queue.
//!
//! Nothing here waits for a consumer. A broadcast subscriber that falls behind loses the
//! oldest events (counted, per subscriber and in metrics); a sink's queue drops its oldest
//! entry when full (see [`SinkQueue`]). Detection never stalls on either.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{broadcast, Notify};

use crate::event::{DetectionEvent, ObjectEvent, SinkMessage, StatusChange};
use crate::telemetry;

/// A live feed of events.
#[derive(Debug)]
pub struct Subscription<T> {
    rx: broadcast::Receiver<Arc<T>>,
    /// Metric label: the stream's name, `*`, or `*objects`.
    label: Arc<str>,
    missed: u64,
}

/// Detection events, one stream's or every stream's.
pub type EventSubscription = Subscription<DetectionEvent>;
/// Object events of every stream.
pub type ObjectSubscription = Subscription<ObjectEvent>;

impl<T> Subscription<T> {
    pub(crate) fn new(rx: broadcast::Receiver<Arc<T>>, label: Arc<str>) -> Self {
        Self { rx, label, missed: 0 }
    }

    /// The next event; `None` when the stream (or the manager, for the all-streams feed)
    /// has stopped. Events lost to lagging are skipped and counted.
    pub async fn recv(&mut self) -> Option<Arc<T>> {
        loop {
            match self.rx.recv().await {
                Ok(event) => return Some(event),
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    self.missed += n;
                    telemetry::subscriber_lagged(&self.label, n);
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    /// Events this subscriber lost by falling behind.
    pub fn missed(&self) -> u64 {
        self.missed
    }
}

/// Where every stream's events and status changes go, shared by all streams.
#[derive(Debug)]
pub(crate) struct EventFanout {
    pub all: broadcast::Sender<Arc<DetectionEvent>>,
    /// Object events of every stream (the API's `/v1/events/stream`).
    pub objects: broadcast::Sender<Arc<ObjectEvent>>,
    pub sinks: Vec<SinkQueue>,
}

impl EventFanout {
    pub fn status(&self, change: StatusChange) {
        for sink in &self.sinks {
            sink.push(SinkMessage::Status(change.clone()));
        }
    }
}

/// One stream's publishing side.
#[derive(Debug, Clone)]
pub(crate) struct StreamPublisher {
    pub stream: broadcast::Sender<Arc<DetectionEvent>>,
    pub fanout: Arc<EventFanout>,
}

impl StreamPublisher {
    pub fn publish(&self, event: DetectionEvent) -> Arc<DetectionEvent> {
        let event = Arc::new(event);
        // A send error only means nobody is subscribed right now.
        let _ = self.stream.send(event.clone());
        let _ = self.fanout.all.send(event.clone());
        for sink in &self.fanout.sinks {
            sink.push(SinkMessage::Detection(event.clone()));
        }
        event
    }

    pub fn publish_object(&self, event: ObjectEvent) {
        let event = Arc::new(event);
        let _ = self.fanout.objects.send(event.clone());
        for sink in &self.fanout.sinks {
            sink.push(SinkMessage::Object(event.clone()));
        }
    }
}

#[derive(Debug)]
struct QueueShared {
    sink: &'static str,
    capacity: usize,
    items: Mutex<(VecDeque<SinkMessage>, bool)>,
    notify: Notify,
    dropped: AtomicU64,
}

/// A bounded drop-oldest queue feeding one sink. Cloning shares the queue.
#[derive(Debug, Clone)]
pub struct SinkQueue {
    shared: Arc<QueueShared>,
}

impl SinkQueue {
    /// `sink` names the sink in metrics (`mqtt`, `webhook`).
    pub fn new(sink: &'static str, capacity: usize) -> Self {
        Self {
            shared: Arc::new(QueueShared {
                sink,
                capacity: capacity.max(1),
                items: Mutex::new((VecDeque::new(), false)),
                notify: Notify::new(),
                dropped: AtomicU64::new(0),
            }),
        }
    }

    /// Never waits: when full, the oldest message is dropped to make room (counted).
    /// Status changes are kept over detections when choosing what to drop, as they are
    /// rare and a consumer needs the latest one.
    pub fn push(&self, message: SinkMessage) {
        let s = &self.shared;
        let Ok(mut guard) = s.items.lock() else { return };
        let (items, closed) = &mut *guard;
        if *closed {
            return;
        }
        if items.len() >= s.capacity {
            let victim = items
                .iter()
                .position(|m| matches!(m, SinkMessage::Detection(_)))
                .unwrap_or(0);
            items.remove(victim);
            s.dropped.fetch_add(1, Ordering::Relaxed);
            telemetry::sink_dropped(s.sink, "queue_full");
        }
        items.push_back(message);
        drop(guard);
        s.notify.notify_one();
    }

    /// The oldest message; `None` once closed and drained.
    pub async fn pop(&self) -> Option<SinkMessage> {
        loop {
            {
                let Ok(mut guard) = self.shared.items.lock() else {
                    return None;
                };
                let (items, closed) = &mut *guard;
                if let Some(m) = items.pop_front() {
                    return Some(m);
                }
                if *closed {
                    return None;
                }
            }
            self.shared.notify.notified().await;
        }
    }

    /// Stops accepting; the consumer drains what is left, then sees `None`.
    pub fn close(&self) {
        if let Ok(mut guard) = self.shared.items.lock() {
            guard.1 = true;
        }
        self.shared.notify.notify_one();
    }

    /// Messages dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    pub fn len(&self) -> usize {
        self.shared.items.lock().map(|g| g.0.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::StreamStatus;

    #[tokio::test]
    async fn a_lagging_subscriber_loses_the_oldest_events_and_counts_them() {
        let (tx, rx) = broadcast::channel(2);
        let mut sub = EventSubscription::new(rx, "cam1".into());
        for seq in 0..5 {
            // Sending never waits for the subscriber.
            tx.send(Arc::new(crate::sinks::wire::tests::event(seq))).unwrap();
        }
        assert_eq!(sub.recv().await.unwrap().seq, 3, "the two newest are kept");
        assert_eq!(sub.recv().await.unwrap().seq, 4);
        assert_eq!(sub.missed(), 3);
        drop(tx);
        assert!(sub.recv().await.is_none(), "ends when the stream does");
    }

    fn status(n: u32) -> SinkMessage {
        SinkMessage::Status(StatusChange {
            stream: "s".into(),
            status: StreamStatus::Connecting { attempt: n },
        })
    }

    fn detection(seq: u64) -> SinkMessage {
        SinkMessage::Detection(Arc::new(crate::sinks::wire::tests::event(seq)))
    }

    fn seq_of(m: &SinkMessage) -> i64 {
        match m {
            SinkMessage::Detection(e) => e.seq as i64,
            SinkMessage::Status(_) | SinkMessage::Object(_) => -1,
        }
    }

    #[tokio::test]
    async fn full_queue_drops_oldest_detection_first() {
        let q = SinkQueue::new("test", 3);
        q.push(status(1));
        for seq in 0..4 {
            q.push(detection(seq));
        }
        assert_eq!(q.dropped(), 2);
        let mut got = Vec::new();
        q.close();
        while let Some(m) = q.pop().await {
            got.push(seq_of(&m));
        }
        assert_eq!(got, [-1, 2, 3], "status kept, detections 0 and 1 dropped");
    }
}

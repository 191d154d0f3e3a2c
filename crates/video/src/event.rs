//! Results as plain data, and how they fan out: a bounded broadcast per stream and one for
//! all streams (for SSE and WebSocket handlers), plus each sink's own bounded queue.
//!
//! Nothing here waits for a consumer. A broadcast subscriber that falls behind loses the
//! oldest events (counted, per subscriber and in metrics); a sink's queue drops its oldest
//! entry when full (see [`crate::sinks::SinkQueue`]). Detection never stalls on either.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use peregrine_types::{ClassNames, Detection};
use tokio::sync::broadcast;

use crate::frame::{CaptureTime, Pts};
use crate::sinks::SinkQueue;
use crate::supervisor::StreamStatus;
use crate::telemetry;

/// The detections of one frame.
#[derive(Debug, Clone)]
pub struct DetectionEvent {
    pub stream: Arc<str>,
    /// The frame's sequence number on its stream (frames decoded before it).
    pub seq: u64,
    pub pts: Pts,
    pub capture: CaptureTime,
    pub width: u32,
    pub height: u32,
    /// In the frame's pixels, best first.
    pub detections: Vec<Detection>,
    /// Names for the `class_id`s, from the model that produced them.
    pub class_names: ClassNames,
    /// Wall clock when the result was published.
    pub published: SystemTime,
    /// Glass to result: `published - capture.wall` (zero if the camera's clock is ahead).
    pub latency: Duration,
}

/// A stream's status changed (connected, lost, backing off, removed).
#[derive(Debug, Clone)]
pub struct StatusChange {
    pub stream: Arc<str>,
    pub status: StreamStatus,
}

/// What sinks receive.
#[derive(Debug, Clone)]
pub enum SinkMessage {
    Detection(Arc<DetectionEvent>),
    Status(StatusChange),
}

/// A live feed of detection events (one stream's, or every stream's).
#[derive(Debug)]
pub struct EventSubscription {
    rx: broadcast::Receiver<Arc<DetectionEvent>>,
    /// Metric label: the stream's name or `*`.
    label: Arc<str>,
    missed: u64,
}

impl EventSubscription {
    pub(crate) fn new(rx: broadcast::Receiver<Arc<DetectionEvent>>, label: Arc<str>) -> Self {
        Self { rx, label, missed: 0 }
    }

    /// The next event; `None` when the stream (or the manager, for the all-streams feed)
    /// has stopped. Events lost to lagging are skipped and counted.
    pub async fn recv(&mut self) -> Option<Arc<DetectionEvent>> {
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
    pub fn publish(&self, event: DetectionEvent) {
        let event = Arc::new(event);
        // A send error only means nobody is subscribed right now.
        let _ = self.stream.send(event.clone());
        let _ = self.fanout.all.send(event.clone());
        for sink in &self.fanout.sinks {
            sink.push(SinkMessage::Detection(event.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

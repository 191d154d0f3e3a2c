//! Where results go besides the in-process broadcasts: MQTT ([`mqtt`]) and HTTP webhooks
//! ([`webhook`]), both speaking the JSON of [`wire`].
//!
//! Every sink reads from its own [`SinkQueue`], bounded, which drops its oldest message
//! when full: a sink that is slow or whose peer is down loses old results (counted) and
//! never slows detection or the other sinks.

pub mod mqtt;
pub mod tls;
pub mod webhook;
pub mod wire;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::event::SinkMessage;
use crate::telemetry;

/// The sinks a [`crate::VideoConfig`] asks for, started together.
#[derive(Debug)]
pub struct ConfiguredSinks {
    pub mqtt: Option<mqtt::MqttSink>,
    pub webhooks: Vec<webhook::WebhookSink>,
}

impl ConfiguredSinks {
    /// Starts every configured sink (inside a tokio runtime); the first bad one fails all.
    pub fn start(config: &crate::VideoConfig) -> Result<Self, SinkError> {
        let mqtt = config.mqtt.as_ref().map(mqtt::MqttSink::start).transpose()?;
        let webhooks = config
            .webhooks
            .iter()
            .map(webhook::WebhookSink::start)
            .collect::<Result<_, _>>()?;
        Ok(Self { mqtt, webhooks })
    }

    /// The queues to put in [`crate::ManagerOptions::sinks`].
    pub fn queues(&self) -> Vec<SinkQueue> {
        self.mqtt
            .iter()
            .map(mqtt::MqttSink::queue)
            .chain(self.webhooks.iter().map(webhook::WebhookSink::queue))
            .collect()
    }

    /// Flushes and stops every sink (each within its own bounded grace period).
    pub async fn shut_down(self) {
        if let Some(m) = self.mqtt {
            m.shut_down().await;
        }
        for w in self.webhooks {
            w.shut_down().await;
        }
    }
}

/// A sink's failures when it starts.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum SinkError {
    #[error("invalid {sink} configuration: {problem}")]
    Config { sink: &'static str, problem: String },
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
    use crate::event::StatusChange;
    use crate::supervisor::StreamStatus;

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
            SinkMessage::Status(_) => -1,
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

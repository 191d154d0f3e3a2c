//! Where results go besides the in-process broadcasts: MQTT ([`mqtt`]) and HTTP webhooks
//! ([`webhook`]), both speaking the JSON of [`wire`], and the event store ([`store`]).
//!
//! Every sink reads from its own [`SinkQueue`] (in [`crate::fanout`]), bounded, which drops its oldest message
//! when full: a sink that is slow or whose peer is down loses old results (counted) and
//! never slows detection or the other sinks.

pub mod mqtt;
pub mod store;
pub mod tls;
pub mod webhook;
pub mod wire;

use crate::fanout::SinkQueue;

/// The sinks a [`crate::VideoConfig`] asks for, started together.
#[derive(Debug)]
pub struct ConfiguredSinks {
    pub mqtt: Option<mqtt::MqttSink>,
    pub webhooks: Vec<webhook::WebhookSink>,
}

impl ConfiguredSinks {
    /// Starts every configured sink (inside a tokio runtime); the first bad one fails all.
    /// `snapshots_served`: the event store keeps snapshots, so object events link them.
    pub fn start(config: &crate::VideoConfig, snapshots_served: bool) -> Result<Self, SinkError> {
        let mqtt = config
            .mqtt
            .as_ref()
            .map(|c| mqtt::MqttSink::start(c, snapshots_served))
            .transpose()?;
        let webhooks = config
            .webhooks
            .iter()
            .map(|c| webhook::WebhookSink::start(c, snapshots_served))
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

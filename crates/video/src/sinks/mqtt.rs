//! Results to an MQTT broker through rumqttc, with Frigate-style topics:
//!
//! | topic | payload | QoS | retained |
//! |---|---|---|---|
//! | `<prefix>/available` | `online` / `offline` (also the last will) | 1 | yes |
//! | `<prefix>/<stream>/status` | status JSON ([`super::wire`]) | 1 | yes |
//! | `<prefix>/<stream>/detections` | event JSON ([`super::wire`]), one per frame | 0 | no |
//! | `<prefix>/events` | object event JSON (`object.start` / `object.update` / `object.end` with `before` and `after`, `zone.enter`, ...) | 1 | no |
//! | `<prefix>/<stream>/<label>/snapshot` | the latest event snapshot of that label (JPEG; an update's new best too) | 0 | yes |
//!
//! Why: availability and status are rare and a newcomer needs the current value, so they
//! are retained and acknowledged; detections are a live, high-rate feed where a result
//! re-delivered late is worse than one lost, so they are fire-and-forget and not retained
//! (a retained detection would show a stale box to every new subscriber). Object events are
//! rare and each one matters, so they are acknowledged (updates are rate-limited per object
//! by the stream's `update_interval_s`); the snapshot of each label is retained so a
//! dashboard shows the last one seen.
//!
//! Queues: the sink's [`SinkQueue`] (drop oldest, `queue` entries), then rumqttc's request
//! channel (`REQUEST_CHANNEL` entries; the publisher waits on it, so while the broker is
//! away the drops happen in the sink queue, oldest first).
//!
//! After every (re)connection the publisher publishes each running stream's latest status
//! again: a broker that restarted without persistence has lost the retained ones, and a
//! subscriber must still find the current value there.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rumqttc::{
    AsyncClient, Event, LastWill, MqttOptions, Outgoing, Packet, QoS, TlsConfiguration, Transport,
};
use serde::Deserialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::tls::{self, TlsFiles};
use super::{wire, SinkError, SinkQueue};
use crate::event::{SinkMessage, StatusChange, StreamStatus};
use crate::telemetry;

/// Requests rumqttc holds before the publisher waits.
const REQUEST_CHANNEL: usize = 64;
/// Pause between reconnection attempts to an unreachable broker.
const RECONNECT_DELAY: Duration = Duration::from_secs(1);
/// Longest wait for queued messages and the `offline` message at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

#[derive(Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MqttConfig {
    pub host: String,
    /// Absent: 1883, or 8883 with `tls`.
    pub port: Option<u16>,
    /// Connect over TLS (MQTTS), verifying the broker's certificate.
    #[serde(default)]
    pub tls: bool,
    /// PEM CA certificates trusted for `tls` besides the bundled public roots.
    pub ca_file: Option<PathBuf>,
    /// PEM certificate chain for mutual TLS; needs `client_key_file`.
    pub client_cert_file: Option<PathBuf>,
    /// PEM private key of `client_cert_file`.
    pub client_key_file: Option<PathBuf>,
    #[serde(default = "defaults::client_id")]
    pub client_id: String,
    #[serde(default = "defaults::prefix")]
    pub topic_prefix: String,
    pub username: Option<String>,
    pub password: Option<String>,
    /// Messages waiting for the broker before the oldest are dropped.
    #[serde(default = "defaults::queue")]
    pub queue: usize,
    #[serde(default = "defaults::keep_alive_s")]
    pub keep_alive_s: u64,
}

impl std::fmt::Debug for MqttConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("client_cert_file", &self.client_cert_file)
            .field("client_key_file", &self.client_key_file)
            .field("client_id", &self.client_id)
            .field("topic_prefix", &self.topic_prefix)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

mod defaults {
    pub fn client_id() -> String {
        "peregrine".into()
    }
    pub fn prefix() -> String {
        "peregrine".into()
    }
    pub fn queue() -> usize {
        256
    }
    pub fn keep_alive_s() -> u64 {
        30
    }
}

impl MqttConfig {
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self {
            host: host.into(),
            port: Some(port),
            tls: false,
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
            client_id: defaults::client_id(),
            topic_prefix: defaults::prefix(),
            username: None,
            password: None,
            queue: defaults::queue(),
            keep_alive_s: defaults::keep_alive_s(),
        }
    }

    /// The port connected to: the one given, else MQTT's own for plain or TLS.
    pub fn effective_port(&self) -> u16 {
        self.port.unwrap_or(if self.tls { 8883 } else { 1883 })
    }

    fn tls_files(&self) -> TlsFiles {
        TlsFiles {
            ca_file: self.ca_file.clone(),
            client_cert_file: self.client_cert_file.clone(),
            client_key_file: self.client_key_file.clone(),
        }
    }

    fn available_topic(&self) -> String {
        format!("{}/available", self.topic_prefix)
    }
}

/// What a sink's connection to its broker has been through.
#[derive(Debug, Default)]
pub struct MqttStats {
    /// Connections the broker accepted (CONNACKs), reconnections included.
    pub connections: AtomicU64,
    /// Connection attempts that failed and connections that broke.
    pub connection_errors: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl MqttStats {
    /// The latest connection error, as rumqttc described it.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().ok().and_then(|e| e.clone())
    }

    fn connection_failed(&self, error: String) {
        self.connection_errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut last) = self.last_error.lock() {
            *last = Some(error);
        }
    }
}

/// A running MQTT sink: feed it through [`MqttSink::queue`].
#[derive(Debug)]
pub struct MqttSink {
    queue: SinkQueue,
    stats: Arc<MqttStats>,
    client: AsyncClient,
    available_topic: String,
    publisher: JoinHandle<()>,
    event_loop: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

impl MqttSink {
    /// Starts the connection (in the background; an absent broker is retried) and the
    /// publisher. Must be called inside a tokio runtime.
    /// Starts the sink; `snapshots_served`: object events link their snapshots (the event
    /// store keeps them and the API serves them).
    pub fn start(config: &MqttConfig, snapshots_served: bool) -> Result<Self, SinkError> {
        let bad = |problem: &str| SinkError::Config {
            sink: "mqtt",
            problem: problem.into(),
        };
        if config.host.is_empty() {
            return Err(bad("host is empty"));
        }
        if config.topic_prefix.is_empty() || config.topic_prefix.contains(['#', '+']) {
            return Err(bad("topic_prefix must be non-empty, without '#' or '+'"));
        }
        let mut options = MqttOptions::new(&config.client_id, &config.host, config.effective_port());
        if config.tls {
            let tls = tls::client_config(&config.tls_files()).map_err(|e| bad(&e))?;
            options.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(tls)));
        } else if !config.tls_files().is_empty() {
            return Err(bad(
                "ca_file, client_cert_file and client_key_file need tls = true",
            ));
        }
        options.set_keep_alive(Duration::from_secs(config.keep_alive_s.max(5)));
        // rumqttc refuses packets over 10 KiB by default, and an oversized one drops the
        // connection: snapshots (tens to hundreds of KiB) need room; incoming stays small.
        options.set_max_packet_size(10 * 1024, MAX_OUTGOING_PACKET);
        options.set_clean_session(true);
        options.set_last_will(LastWill::new(
            config.available_topic(),
            "offline",
            QoS::AtLeastOnce,
            true,
        ));
        if let Some(user) = &config.username {
            options.set_credentials(user, config.password.clone().unwrap_or_default());
        }
        let (client, event_loop) = AsyncClient::new(options, REQUEST_CHANNEL);
        let (stop, stop_rx) = watch::channel(false);
        let queue = SinkQueue::new("mqtt", config.queue);
        let stats = Arc::new(MqttStats::default());
        let (connected_tx, connected) = watch::channel(0u64);
        let event_loop = tokio::spawn(drive_connection(
            event_loop,
            Connection {
                client: client.clone(),
                available_topic: config.available_topic(),
                stats: stats.clone(),
                connected: connected_tx,
            },
            stop_rx,
        ));
        let publisher = tokio::spawn(publish_messages(
            queue.clone(),
            client.clone(),
            Topics {
                prefix: config.topic_prefix.clone(),
                snapshots_served,
            },
            connected,
        ));
        Ok(Self {
            queue,
            stats,
            client,
            available_topic: config.available_topic(),
            publisher,
            event_loop,
            stop,
        })
    }

    /// The queue to hand to the stream manager.
    pub fn queue(&self) -> SinkQueue {
        self.queue.clone()
    }

    pub fn stats(&self) -> &MqttStats {
        &self.stats
    }

    /// Publishes what is queued (for at most a couple of seconds), marks the server
    /// `offline`, disconnects and ends both tasks.
    pub async fn shut_down(mut self) {
        self.queue.close();
        if tokio::time::timeout(SHUTDOWN_GRACE, &mut self.publisher)
            .await
            .is_err()
        {
            self.publisher.abort();
        }
        let _ = self.stop.send(true);
        let goodbye = async {
            let _ = self
                .client
                .publish(&self.available_topic, QoS::AtLeastOnce, true, "offline")
                .await;
            let _ = self.client.disconnect().await;
        };
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, goodbye).await;
        if tokio::time::timeout(SHUTDOWN_GRACE, &mut self.event_loop)
            .await
            .is_err()
        {
            self.event_loop.abort();
        }
    }
}

/// Publishes the queue's messages; after every connection, each stream's latest status
/// again (see the module's notes). `connected` counts connections.
/// Where and how the publisher writes.
struct Topics {
    prefix: String,
    snapshots_served: bool,
}

async fn publish_messages(
    queue: SinkQueue,
    client: AsyncClient,
    topics: Topics,
    mut connected: watch::Receiver<u64>,
) {
    // One entry per stream that has not stopped: bounded by the running streams.
    let mut statuses: BTreeMap<Arc<str>, StatusChange> = BTreeMap::new();
    let mut connection_alive = true;
    loop {
        let sent = tokio::select! {
            message = queue.pop() => {
                let Some(message) = message else { return };
                if let SinkMessage::Status(change) = &message {
                    if matches!(change.status, StreamStatus::Stopped { .. }) {
                        statuses.remove(&change.stream);
                    } else {
                        statuses.insert(change.stream.clone(), change.clone());
                    }
                }
                publish(&client, &topics, &message).await
            }
            changed = connected.changed(), if connection_alive => {
                connection_alive = changed.is_ok();
                let mut sent = Ok(());
                for change in statuses.values() {
                    sent = sent.and(publish(&client, &topics, &SinkMessage::Status(change.clone())).await);
                }
                sent
            }
        };
        // Only a closed event loop fails here; nothing more can be sent.
        if sent.is_err() {
            return;
        }
    }
}

async fn publish(
    client: &AsyncClient,
    topics: &Topics,
    message: &SinkMessage,
) -> Result<(), rumqttc::ClientError> {
    let prefix = topics.prefix.as_str();
    let sent = match message {
        SinkMessage::Detection(event) => {
            let topic = format!("{prefix}/{}/detections", event.stream);
            client
                .publish(topic, QoS::AtMostOnce, false, wire::event_json(event))
                .await
        }
        SinkMessage::Status(change) => {
            let topic = format!("{prefix}/{}/status", change.stream);
            client
                .publish(topic, QoS::AtLeastOnce, true, wire::status_json(change))
                .await
        }
        SinkMessage::Object(event) => publish_object(client, topics, event).await,
    };
    if sent.is_ok() {
        telemetry::sink_delivered("mqtt");
    }
    sent
}

/// The largest packet the sink sends; a snapshot that would not fit is not published.
const MAX_OUTGOING_PACKET: usize = 8 << 20;

/// An object event on `<prefix>/events` and, when it has one, its snapshot on
/// `<prefix>/<stream>/<label>/snapshot` (retained: the latest picture of each kind of object,
/// as Frigate publishes them).
async fn publish_object(
    client: &AsyncClient,
    topics: &Topics,
    event: &crate::event::ObjectEvent,
) -> Result<(), rumqttc::ClientError> {
    let prefix = topics.prefix.as_str();
    let body = wire::sink_object_json(event, topics.snapshots_served);
    client
        .publish(format!("{prefix}/events"), QoS::AtLeastOnce, false, body)
        .await?;
    if let Some(jpeg) = event
        .snapshot
        .as_ref()
        .filter(|j| j.len() + 1024 < MAX_OUTGOING_PACKET)
    {
        let topic = format!("{prefix}/{}/{}/snapshot", event.stream, topic_part(&event.label));
        client
            .publish(topic, QoS::AtMostOnce, true, jpeg.to_vec())
            .await?;
    }
    Ok(())
}

/// A label as one MQTT topic level: no `/`, `+`, `#` or spaces.
fn topic_part(label: &str) -> String {
    label
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The event loop's side of the sink.
struct Connection {
    client: AsyncClient,
    available_topic: String,
    stats: Arc<MqttStats>,
    /// Bumped on every CONNACK.
    connected: watch::Sender<u64>,
}

/// Polls rumqttc's event loop, which also reconnects; announces `online` on each connect.
async fn drive_connection(
    mut event_loop: rumqttc::EventLoop,
    connection: Connection,
    mut stop: watch::Receiver<bool>,
) {
    let Connection {
        client,
        available_topic,
        stats,
        connected,
    } = connection;
    let mut reported_failure = false;
    loop {
        match event_loop.poll().await {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                reported_failure = false;
                stats.connections.fetch_add(1, Ordering::Relaxed);
                tracing::info!(topic = %available_topic, "connected to the MQTT broker");
                let _ = client.try_publish(&available_topic, QoS::AtLeastOnce, true, "online");
                connected.send_modify(|n| *n += 1);
            }
            Ok(Event::Outgoing(Outgoing::Disconnect)) => return,
            Ok(_) => {}
            Err(e) => {
                if *stop.borrow() {
                    return;
                }
                stats.connection_failed(e.to_string());
                if !reported_failure {
                    tracing::warn!(error = %e, "MQTT broker unreachable; retrying every second");
                    reported_failure = true;
                }
                tokio::select! {
                    _ = tokio::time::sleep(RECONNECT_DELAY) => {}
                    _ = stop.changed() => return,
                }
            }
        }
    }
}

//! Results POSTed as JSON ([`super::wire`]) to an HTTP endpoint, one request per event,
//! retried with backoff on network errors, timeouts, 408, 429 and 5xx, and given up after
//! `max_attempts` (counted). Other 4xx answers are given up at once: repeating the same
//! request will not fix it. While a delivery is being retried, newer events wait in the
//! sink's queue, which drops its oldest when full.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::task::JoinHandle;

use super::tls::{self, TlsFiles};
use super::{wire, SinkError, SinkQueue};
use crate::backoff::{Backoff, BackoffPolicy};
use crate::event::SinkMessage;
use crate::telemetry;

/// Longest wait for queued deliveries at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// `http://` or `https://` endpoint; an https server's certificate is verified.
    pub url: String,
    /// PEM CA certificates trusted for https besides the bundled public roots.
    pub ca_file: Option<PathBuf>,
    /// PEM certificate chain for mutual TLS; needs `client_key_file`.
    pub client_cert_file: Option<PathBuf>,
    /// PEM private key of `client_cert_file`.
    pub client_key_file: Option<PathBuf>,
    /// Per request.
    #[serde(default = "defaults::timeout_ms")]
    pub timeout_ms: u64,
    /// Tries per event, the first included.
    #[serde(default = "defaults::max_attempts")]
    pub max_attempts: u32,
    #[serde(default = "defaults::retry_initial_ms")]
    pub retry_initial_ms: u64,
    #[serde(default = "defaults::retry_max_ms")]
    pub retry_max_ms: u64,
    /// Events waiting before the oldest are dropped.
    #[serde(default = "defaults::queue")]
    pub queue: usize,
    /// Only these streams' events (empty: all).
    #[serde(default)]
    pub streams: Vec<String>,
    /// Also POST status changes.
    #[serde(default)]
    pub include_status: bool,
}

mod defaults {
    pub fn timeout_ms() -> u64 {
        5_000
    }
    pub fn max_attempts() -> u32 {
        5
    }
    pub fn retry_initial_ms() -> u64 {
        200
    }
    pub fn retry_max_ms() -> u64 {
        5_000
    }
    pub fn queue() -> usize {
        256
    }
}

impl WebhookConfig {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
            timeout_ms: defaults::timeout_ms(),
            max_attempts: defaults::max_attempts(),
            retry_initial_ms: defaults::retry_initial_ms(),
            retry_max_ms: defaults::retry_max_ms(),
            queue: defaults::queue(),
            streams: Vec::new(),
            include_status: false,
        }
    }
}

/// What a webhook sink has done so far.
#[derive(Debug, Default)]
pub struct WebhookStats {
    pub delivered: AtomicU64,
    pub retried: AtomicU64,
    pub gave_up: AtomicU64,
}

/// A running webhook sink: feed it through [`WebhookSink::queue`].
#[derive(Debug)]
pub struct WebhookSink {
    queue: SinkQueue,
    stats: Arc<WebhookStats>,
    task: JoinHandle<()>,
}

impl WebhookSink {
    /// Starts the sink; `snapshots_served`: object events link their snapshots (the event
    /// store keeps them and the API serves them).
    pub fn start(config: &WebhookConfig, snapshots_served: bool) -> Result<Self, SinkError> {
        let bad = |problem: String| SinkError::Config {
            sink: "webhook",
            problem,
        };
        let url = reqwest::Url::parse(&config.url).map_err(|e| bad(format!("bad url: {e}")))?;
        let files = TlsFiles {
            ca_file: config.ca_file.clone(),
            client_cert_file: config.client_cert_file.clone(),
            client_key_file: config.client_key_file.clone(),
        };
        let mut client = reqwest::Client::builder().timeout(Duration::from_millis(config.timeout_ms.max(1)));
        match url.scheme() {
            "https" => {
                let tls = tls::client_config(&files).map_err(bad)?;
                client = client.use_preconfigured_tls(Arc::unwrap_or_clone(tls));
            }
            "http" if files.is_empty() => {}
            "http" => {
                return Err(bad(
                    "ca_file, client_cert_file and client_key_file need an https:// url".into(),
                ))
            }
            other => return Err(bad(format!("url must be http:// or https://, not {other}://"))),
        }
        let client = client.build().map_err(|e| bad(e.to_string()))?;
        let queue = SinkQueue::new("webhook", config.queue);
        let stats = Arc::new(WebhookStats::default());
        let delivery = Delivery {
            client,
            url,
            config: config.clone(),
            stats: stats.clone(),
            snapshots_served,
        };
        let task = tokio::spawn(delivery.run(queue.clone()));
        Ok(Self { queue, stats, task })
    }

    pub fn queue(&self) -> SinkQueue {
        self.queue.clone()
    }

    pub fn stats(&self) -> &WebhookStats {
        &self.stats
    }

    /// Delivers what is queued (for at most a few seconds), then ends the task.
    pub async fn shut_down(mut self) {
        self.queue.close();
        if tokio::time::timeout(SHUTDOWN_GRACE, &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
    }
}

struct Delivery {
    client: reqwest::Client,
    url: reqwest::Url,
    config: WebhookConfig,
    stats: Arc<WebhookStats>,
    snapshots_served: bool,
}

enum Attempt {
    Delivered,
    Retry(String),
    GiveUp(String),
}

impl Delivery {
    async fn run(self, queue: SinkQueue) {
        while let Some(message) = queue.pop().await {
            let body = match &message {
                SinkMessage::Detection(e) if self.wanted(&e.stream) => wire::event_json(e),
                SinkMessage::Object(e) if self.wanted(&e.stream) => {
                    wire::sink_object_json(e, self.snapshots_served)
                }
                SinkMessage::Status(c) if self.config.include_status && self.wanted(&c.stream) => {
                    wire::status_json(c)
                }
                _ => continue,
            };
            self.deliver(body).await;
        }
    }

    fn wanted(&self, stream: &str) -> bool {
        self.config.streams.is_empty() || self.config.streams.iter().any(|s| s == stream)
    }

    async fn deliver(&self, body: Vec<u8>) {
        let mut backoff = Backoff::new(BackoffPolicy {
            initial: Duration::from_millis(self.config.retry_initial_ms.max(1)),
            max: Duration::from_millis(self.config.retry_max_ms.max(self.config.retry_initial_ms)),
            ..BackoffPolicy::default()
        });
        let attempts = self.config.max_attempts.max(1);
        for attempt in 1..=attempts {
            let reason = match self.attempt(body.clone()).await {
                Attempt::Delivered => {
                    self.stats.delivered.fetch_add(1, Ordering::Relaxed);
                    telemetry::sink_delivered("webhook");
                    return;
                }
                Attempt::GiveUp(reason) => {
                    self.give_up(&reason);
                    return;
                }
                Attempt::Retry(reason) => reason,
            };
            if attempt == attempts {
                self.give_up(&reason);
                return;
            }
            self.stats.retried.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(backoff.after_failure(rand::random::<f64>())).await;
        }
    }

    async fn attempt(&self, body: Vec<u8>) -> Attempt {
        let sent = self
            .client
            .post(self.url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => Attempt::Delivered,
            Ok(r) => {
                let s = r.status();
                let retryable = s.is_server_error() || s.as_u16() == 408 || s.as_u16() == 429;
                if retryable {
                    Attempt::Retry(format!("status {s}"))
                } else {
                    Attempt::GiveUp(format!("status {s}"))
                }
            }
            Err(e) => Attempt::Retry(e.to_string()),
        }
    }

    fn give_up(&self, reason: &str) {
        self.stats.gave_up.fetch_add(1, Ordering::Relaxed);
        telemetry::sink_dropped("webhook", "gave_up");
        tracing::warn!(url = %self.url, reason, "webhook delivery given up");
    }
}

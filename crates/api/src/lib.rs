//! Peregrine's HTTP API: the only crate that knows JSON.
//!
//! - [`router`] builds the axum `Router` over an [`AppState`] (the engines by model name,
//!   limits, the metrics handle).
//! - `detect`: `POST /v1/detect` (raw image body, multipart files, or JSON with base64).
//! - `health`: liveness, readiness (every engine warmed up, not draining), `/metrics`.
//! - `error`: [`ApiError`], the single mapping from engine errors to HTTP status codes.
//! - `wire`: request and response bodies.
//! - `openapi.json`: the API description served at `/openapi.json`.

mod detect;
mod error;
mod health;
mod wire;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use peregrine_engine::{telemetry, Engine};

pub use error::ApiError;
pub use wire::DetectionJson;

/// Limits and defaults of the HTTP layer.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// Largest request body accepted (413 beyond).
    pub max_body_bytes: usize,
    /// Deadline of a request that names none.
    pub default_timeout: Duration,
    /// Longest deadline a request may ask for; longer ones are cut to this.
    pub max_timeout: Duration,
    /// Longest time a client may take to send its body (408 beyond).
    pub body_timeout: Duration,
}

/// Everything a handler needs. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub engines: Arc<BTreeMap<String, Engine>>,
    pub default_model: String,
    pub config: ApiConfig,
    pub metrics: PrometheusHandle,
    /// Set when shutdown begins: readiness turns false so load balancers move away.
    pub draining: Arc<AtomicBool>,
}

impl AppState {
    fn engine(&self, name: Option<&str>) -> Result<&Engine, ApiError> {
        let name = name.unwrap_or(&self.default_model);
        self.engines.get(name).ok_or_else(|| ApiError::UnknownModel {
            name: name.to_string(),
            known: self.engines.keys().cloned().collect(),
        })
    }
}

/// Installs the process-wide Prometheus recorder with Peregrine's histogram buckets.
pub fn install_metrics_recorder() -> Result<PrometheusHandle, String> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), telemetry::DURATION_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(telemetry::BATCH_SIZE.into()),
                telemetry::BATCH_BUCKETS,
            )
        })
        .and_then(|b| b.install_recorder())
        .map_err(|e| e.to_string())
}

const OPENAPI: &str = include_str!("openapi.json");

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/detect", post(detect::detect))
        .route("/health/live", get(health::live))
        .route("/health/ready", get(health::ready))
        .route("/metrics", get(health::metrics))
        .route(
            "/openapi.json",
            get(|| async { ([(axum::http::header::CONTENT_TYPE, "application/json")], OPENAPI) }),
        )
        .fallback(|| async { ApiError::NotFound })
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openapi_document_is_json_and_lists_every_route() {
        let doc: serde_json::Value = serde_json::from_str(OPENAPI).expect("openapi.json parses");
        let paths = doc["paths"].as_object().unwrap();
        for route in [
            "/v1/detect",
            "/health/live",
            "/health/ready",
            "/metrics",
            "/openapi.json",
        ] {
            assert!(paths.contains_key(route), "{route} is not documented");
        }
    }
}

//! Peregrine's HTTP and gRPC API: the only crate that knows JSON and protobuf.
//!
//! - [`router`] builds the axum `Router` over an [`AppState`] (the engines by model name,
//!   limits, the metrics handle).
//! - `detect`: `POST /v1/detect` (raw image body, multipart files, or JSON with base64).
//! - `kserve`: the KServe v2 / Open Inference Protocol over REST with Triton's extensions
//!   (binary tensors, configuration, statistics, repository); `grpc`: the same protocol as
//!   Triton's `GRPCInferenceService`, plus gRPC health, served on its own port.
//! - `streams`: video streams managed at run time (`/v1/streams`) and their detections
//!   pushed live over Server-Sent Events and WebSockets.
//! - `body`: reading bodies under the size and time limits; each request's deadline.
//! - `health`: liveness, readiness (every engine warmed up, not draining), `/metrics`.
//! - `error`: [`ApiError`], the single mapping from engine and registry errors to HTTP
//!   status codes and to gRPC codes.
//! - `wire`: request and response bodies.
//! - `openapi.json`: the API description served at `/openapi.json`.

mod body;
mod detect;
mod error;
/// Entry points for the fuzz targets in `fuzz/`; not part of the API.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod grpc;
mod health;
mod kserve;
mod streams;
mod wire;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use peregrine_engine::{telemetry, Engine};
use peregrine_registry::{LookupError, ModelRegistry};

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
    /// Every model and version being served.
    pub registry: ModelRegistry,
    /// The model of requests that name none; `None` picks the only model there is.
    pub default_model: Option<String>,
    pub config: ApiConfig,
    pub metrics: PrometheusHandle,
    /// The video streams and their detections.
    pub streams: peregrine_video::StreamManagerHandle,
    /// Set when shutdown begins: readiness turns false so load balancers move away.
    pub draining: Arc<AtomicBool>,
}

impl AppState {
    /// The engine for a request: the model it names (else the default), at the version
    /// it names (else the highest ready one).
    fn engine(&self, name: Option<&str>, version: Option<u64>) -> Result<Engine, ApiError> {
        let snapshot = self.registry.snapshot();
        let name = match name.or(self.default_model.as_deref()) {
            Some(n) => n.to_string(),
            None => match snapshot.models.keys().collect::<Vec<_>>().as_slice() {
                [only] => (*only).clone(),
                names => {
                    return Err(ApiError::BadRequest(format!(
                        "name a model (?model=NAME); this server has: {}",
                        names.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(", ")
                    )))
                }
            },
        };
        match snapshot.engine(&name, version) {
            Err(LookupError::UnknownModel { .. }) if !snapshot.started => Err(starting()),
            other => Ok(other?),
        }
    }

    /// The model name requests without one are counted under, for metrics.
    fn default_label(&self) -> String {
        self.default_model.clone().unwrap_or_else(|| "default".into())
    }
}

/// The answer for a model not (yet) known while start-up loads are still running.
fn starting() -> ApiError {
    ApiError::NotReady("the server is still loading its models".into())
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
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(peregrine_video::telemetry::GLASS_TO_RESULT.into()),
                peregrine_video::telemetry::GLASS_TO_RESULT_BUCKETS,
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
        .route("/v1/streams", get(streams::list).post(streams::add))
        .route("/v1/streams/events", get(streams::events_all))
        .route("/v1/streams/ws", get(streams::ws_all))
        .route("/v1/streams/{name}", get(streams::status).delete(streams::remove))
        .route("/v1/streams/{name}/events", get(streams::events_one))
        .route("/v1/streams/{name}/ws", get(streams::ws_one))
        .merge(kserve::routes())
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
            "/v1/streams",
            "/v1/streams/{name}",
            "/v1/streams/events",
            "/v1/streams/{name}/ws",
            "/v2",
            "/v2/health/ready",
            "/v2/models/{m}/infer",
            "/v2/models/{m}/config",
            "/v2/models/{m}/stats",
            "/v2/repository/index",
            "/v2/repository/models/{m}/load",
        ] {
            assert!(paths.contains_key(route), "{route} is not documented");
        }
    }
}

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
//! - `health`: liveness, readiness (every model the server should serve is warmed up, and
//!   the server is not draining), `/metrics`.
//! - [`access`]: which scope each route and gRPC method needs; the middleware and the gRPC
//!   layer that refuse requests without a key allowed to make them.
//! - [`trace`]: W3C `traceparent` in and out, and each request's server span, on HTTP
//!   and gRPC alike.
//! - [`drain`]: shutdown in two steps: new requests refused while admitted ones finish.
//! - `error`: [`ApiError`], the single mapping from engine and registry errors to HTTP
//!   status codes and to gRPC codes.
//! - [`profiling`]: live CPU profiles (`/debug/pprof/profile`, admin, off unless enabled);
//!   [`heap`]: glibc's heap totals (`/debug/pprof/heap`, the same gate).
//! - `gauges`: hand-written gauge families in the text format (`/metrics`).
//! - `wire`: request and response bodies.
//! - `openapi.json`: the API description served at `/openapi.json`.
//! - `console`: the web console's static files, embedded, under `/ui`.

pub mod access;
mod body;
mod console;
mod detect;
pub mod drain;
mod error;
mod events;
mod fallback;
/// Entry points for the fuzz targets in `fuzz/`; not part of the API.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod gauges;
mod gb28181;
pub mod gpu_metrics;
pub mod grpc;
mod health;
pub mod heap;
mod kserve;
mod live;
pub mod profiling;
mod streams;
pub mod tls;
pub mod trace;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use axum::routing::{get, post, put};
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
    /// Stored object events (`None`: storage is off).
    pub events: Option<peregrine_eventstore::EventStore>,
    /// Shutdown's first step: readiness turns false and new requests get 503, so load
    /// balancers move away, while admitted requests finish.
    pub drain: Arc<drain::Drain>,
    /// Who may call what (API keys; [`access::Access::anonymous`] when off).
    pub access: access::Access,
    /// The GPUs' figures for `/metrics` (`None`: no NVIDIA driver, no gauges).
    pub gpu: Option<Arc<gpu_metrics::GpuTelemetry>>,
    /// Live CPU profiles (`None`: profiling is off and its route answers 404).
    pub profiler: Option<Arc<profiling::Profiler>>,
    /// The GB28181 SIP server (`None`: GB28181 is off and its routes answer 404).
    pub gb28181: Option<peregrine_gb28181::service::Gb28181>,
}

impl AppState {
    /// The engine for a request: the model it names (else the default), at the version
    /// it names (else the highest ready one).
    fn engine(&self, name: Option<&str>, version: Option<u64>) -> Result<Engine, ApiError> {
        let snapshot = self.registry.snapshot();
        let named = name.or(self.default_model.as_deref());
        let name = match peregrine_types::named_or_only(named, snapshot.models.keys().map(String::as_str)) {
            Ok(name) => name,
            // Before start-up has listed its models, "none to choose from" means "not yet".
            Err(_) if !snapshot.started => return Err(starting()),
            Err(e) => return Err(ApiError::BadRequest(format!("name a model (?model=NAME); {e}"))),
        };
        match snapshot.route(name, version) {
            Err(LookupError::UnknownModel { .. }) if !snapshot.started => Err(starting()),
            other => Ok(other?),
        }
    }

    /// Ready to take traffic: not draining, start-up over, every model the server should
    /// serve (loaded at start or by request, and not unloaded since) has a warmed-up
    /// version, and at least one model does: a server whose last model was unloaded can
    /// answer no inference, so it is not ready either. HTTP, KServe and gRPC health all
    /// read this.
    fn is_ready(&self) -> bool {
        let snapshot = self.registry.snapshot();
        !self.drain.is_draining()
            && snapshot.is_ready()
            && snapshot.models.values().any(|m| m.serving().is_some())
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
                Matcher::Full(peregrine_video::GLASS_TO_RESULT.into()),
                peregrine_video::GLASS_TO_RESULT_BUCKETS,
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
        .route("/v1/streams/{name}/zones", get(live::zones).put(live::put_zones))
        .route("/v1/streams/{name}/lines", put(live::put_lines))
        .route("/v1/streams/{name}/latest.jpg", get(live::latest))
        .route("/v1/streams/{name}/mjpeg", get(live::mjpeg))
        .route("/v1/gb28181/devices", get(gb28181::devices))
        .route("/v1/gb28181/devices/{id}", get(gb28181::device))
        .route("/v1/events", get(events::list))
        .route("/v1/events/stream", get(events::stream))
        .route("/v1/events/{id}", get(events::get).delete(events::delete))
        .route("/v1/events/{id}/snapshot.jpg", get(events::snapshot))
        .route("/debug/pprof/profile", get(profiling::profile))
        .route("/debug/pprof/heap", get(heap::heap))
        .route("/", get(console::root))
        .route("/ui", get(console::index))
        .route("/ui/{file}", get(console::asset))
        .merge(kserve::routes())
        // Matched routes only, so that the middleware sees the route's template.
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), access::gate))
        // Outside the access gate, so that a refused request is traced too.
        .route_layer(trace::TraceLayer(trace::Protocol::Http))
        .fallback(|| async { ApiError::NotFound })
        .layer(axum::middleware::from_fn_with_state(state.clone(), drain::gate))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// Every `(path, method)` that a `.route("..", ..)` call in `source` serves. Only calls
    /// with a path literal are routes: `snapshot.route(name, version)` is request routing.
    fn routes_in(source: &str) -> BTreeSet<(String, String)> {
        let mut routes = BTreeSet::new();
        for (at, _) in source.match_indices(".route(") {
            let call = &source[at + ".route(".len()..];
            if !call.trim_start().starts_with('"') {
                continue;
            }
            let mut depth = 1;
            let end = call
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '(' => 1,
                        ')' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map(|(i, _)| i)
                .expect("a closed .route( call");
            let call = &call[..end];
            let path = call.split('"').nth(1).expect("a route path literal");
            let methods: Vec<&str> = ["get", "post", "put", "delete", "patch"]
                .into_iter()
                .filter(|m| {
                    call.match_indices(&format!("{m}(")).any(|(i, _)| {
                        i > 0
                            && !call.as_bytes()[i - 1].is_ascii_alphanumeric()
                            && call.as_bytes()[i - 1] != b'_'
                    })
                })
                .collect();
            assert!(!methods.is_empty(), "no method found for {path}");
            for m in methods {
                routes.insert((path.to_string(), m.to_string()));
            }
        }
        routes
    }

    #[test]
    fn the_openapi_document_lists_exactly_the_routes_the_router_serves() {
        let doc: serde_json::Value = serde_json::from_str(OPENAPI).expect("openapi.json parses");
        let documented: BTreeSet<(String, String)> = doc["paths"]
            .as_object()
            .expect("openapi.json has paths")
            .iter()
            .flat_map(|(path, item)| {
                item.as_object()
                    .expect("a path item is an object")
                    .keys()
                    .map(move |method| (path.clone(), method.clone()))
            })
            .collect();
        // The router is built in these two files; a route added anywhere else would not
        // be seen here, so `router` is checked to merge only `kserve::routes`.
        let router_source = include_str!("lib.rs");
        let router_source = &router_source[..router_source.find("#[cfg(test)]").unwrap()];
        assert_eq!(
            router_source.matches(".merge(").count(),
            1,
            "router merges only kserve::routes"
        );
        let mut served = routes_in(router_source);
        served.extend(routes_in(include_str!("kserve/mod.rs")));
        assert!(
            served.len() >= 28,
            "the route scan found only {}: {served:?}",
            served.len()
        );
        let undocumented: Vec<_> = served.difference(&documented).collect();
        let unserved: Vec<_> = documented.difference(&served).collect();
        assert!(
            undocumented.is_empty(),
            "served but not in openapi.json: {undocumented:?}"
        );
        assert!(
            unserved.is_empty(),
            "in openapi.json but not served: {unserved:?}"
        );
    }
}

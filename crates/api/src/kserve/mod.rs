//! The KServe v2 / Open Inference Protocol over REST, with the Triton extensions its
//! clients use (binary tensor data, model configuration, statistics, model repository).
//!
//! - `face`: the detection and tensor models each registry model is offered as.
//! - `infer`: protocol-neutral inference, shared with the gRPC service.
//! - `tensor`: datatypes and the raw and BYTES encodings.
//! - `rest`: the infer route and its binary extension.
//! - `describe`: metadata, configuration and statistics as JSON.
//! - this module: the other routes and the protocol's error body, `{"error": "..."}`.
//!
//! Status codes come from [`ApiError::status`], the same mapping as the rest of the API.

pub(crate) mod describe;
pub(crate) mod face;
pub(crate) mod infer;
pub(crate) mod rest;
pub(crate) mod tensor;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use peregrine_registry::{IndexEntry, RolloutAction, RolloutFile, RolloutPolicy, VersionState};
use serde_json::{json, Value};

use crate::body::read_body;
use crate::{ApiError, AppState};
use face::{FaceInfo, Resolved};

/// Extensions this server implements, as `GET /v2` lists them (perf_analyzer reads
/// server-side statistics only when `statistics` is listed).
pub const EXTENSIONS: &[&str] = &[
    "binary_tensor_data",
    "model_configuration",
    "model_repository",
    "parameters",
    "statistics",
];

/// An error in the protocol's own body format.
pub struct KserveError(pub ApiError);

impl From<ApiError> for KserveError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl IntoResponse for KserveError {
    fn into_response(self) -> Response {
        let status = self.0.status();
        let mut r = (status, Json(json!({ "error": self.0.to_string() }))).into_response();
        if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        r
    }
}

type Answer = Result<Response, KserveError>;

pub fn parse_version(v: &str) -> Result<u64, ApiError> {
    v.parse::<u64>()
        .ok()
        .filter(|&v| v > 0)
        .ok_or_else(|| ApiError::BadRequest(format!("model version {v:?} is not a positive whole number")))
}

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/health/live", get(|| async { StatusCode::OK }))
        .route("/v2/health/ready", get(server_ready))
        .route("/v2/models/stats", get(all_stats))
        .route("/v2/models/{m}", get(|s, Path(m)| metadata(s, m, None)))
        .route(
            "/v2/models/{m}/versions/{v}",
            get(|s, Path((m, v))| metadata(s, m, Some(v))),
        )
        .route("/v2/models/{m}/ready", get(|s, Path(m)| model_ready(s, m, None)))
        .route(
            "/v2/models/{m}/versions/{v}/ready",
            get(|s, Path((m, v))| model_ready(s, m, Some(v))),
        )
        .route("/v2/models/{m}/config", get(|s, Path(m)| config(s, m, None)))
        .route(
            "/v2/models/{m}/versions/{v}/config",
            get(|s, Path((m, v))| config(s, m, Some(v))),
        )
        .route("/v2/models/{m}/stats", get(|s, Path(m)| stats(s, m, None)))
        .route(
            "/v2/models/{m}/versions/{v}/stats",
            get(|s, Path((m, v))| stats(s, m, Some(v))),
        )
        .route("/v2/models/{m}/infer", post(rest::infer_latest))
        .route("/v2/models/{m}/versions/{v}/infer", post(rest::infer_version))
        .route("/v2/repository/index", post(repository_index))
        .route("/v2/repository/models/{m}/load", post(load))
        .route("/v2/repository/models/{m}/unload", post(unload))
        .route("/v2/repository/models/{m}/rollout", post(rollout))
}

async fn server_metadata() -> Json<Value> {
    Json(json!({
        "name": "peregrine",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": EXTENSIONS,
    }))
}

async fn server_ready(State(state): State<AppState>) -> Answer {
    if state.drain.is_draining() {
        return Err(ApiError::Request(peregrine_engine::RequestError::ShuttingDown).into());
    }
    if state.is_ready() {
        Ok(StatusCode::OK.into_response())
    } else {
        Err(ApiError::NotReady(
            "models are still loading, one that should serve has no ready version, or none is loaded".into(),
        )
        .into())
    }
}

/// Describes the face `model` names, at `version` when given.
fn describe<T>(
    state: &AppState,
    model: &str,
    version: Option<String>,
    f: impl FnOnce(&FaceInfo) -> T,
) -> Result<T, KserveError> {
    let version = version.as_deref().map(parse_version).transpose()?;
    let snapshot = state.registry.snapshot();
    let resolved = face::resolve(&snapshot, model)?;
    let info = FaceInfo::of(&resolved, version)?;
    Ok(f(&info))
}

async fn metadata(State(state): State<AppState>, model: String, version: Option<String>) -> Answer {
    describe(&state, &model, version, |i| {
        Json(describe::metadata(i)).into_response()
    })
}

async fn config(State(state): State<AppState>, model: String, version: Option<String>) -> Answer {
    describe(&state, &model, version, |i| {
        Json(describe::config(i)).into_response()
    })
}

async fn stats(State(state): State<AppState>, model: String, version: Option<String>) -> Answer {
    describe(&state, &model, version, |i| {
        let stats: Vec<Value> = i
            .engines
            .iter()
            .map(|e| describe::version_stats(&i.name, e))
            .collect();
        Json(json!({ "model_stats": stats })).into_response()
    })
}

async fn all_stats(State(state): State<AppState>) -> Json<Value> {
    let snapshot = state.registry.snapshot();
    let mut stats = Vec::new();
    for m in snapshot.models.values() {
        for v in &m.versions {
            if let Some(e) = &v.engine {
                stats.push(describe::version_stats(&m.name, e));
                stats.push(describe::version_stats(
                    &format!("{}{}", m.name, face::TENSOR_SUFFIX),
                    e,
                ));
            }
        }
    }
    Json(json!({ "model_stats": stats }))
}

async fn model_ready(State(state): State<AppState>, model: String, version: Option<String>) -> Answer {
    let version = version.as_deref().map(parse_version).transpose()?;
    let snapshot = state.registry.snapshot();
    let Resolved { model: view, .. } = face::resolve(&snapshot, &model)?;
    view.engine(version).map_err(ApiError::from)?;
    Ok(StatusCode::OK.into_response())
}

/// The index as the protocol lists it: `version` and `state` only where known.
pub fn index_json(entries: &[IndexEntry]) -> Value {
    Value::Array(
        entries
            .iter()
            .map(|e| {
                let mut o = json!({ "name": e.name });
                if let Some(v) = e.version {
                    o["version"] = json!(v.to_string());
                }
                if let Some(s) = e.state {
                    o["state"] = json!(state_name(s));
                }
                if let Some(r) = &e.reason {
                    o["reason"] = json!(r);
                }
                if let Some(fp) = &e.sha256 {
                    o["sha256"] = json!(fp.hex());
                }
                o
            })
            .collect(),
    )
}

pub fn state_name(s: VersionState) -> &'static str {
    match s {
        VersionState::Loading => "LOADING",
        VersionState::Ready => "READY",
        VersionState::Unavailable => "UNAVAILABLE",
    }
}

/// An optional JSON body: empty means `{}`.
async fn optional_json(state: &AppState, headers: &HeaderMap, body: Body) -> Result<Value, ApiError> {
    let bytes = read_body(body, headers, &state.config).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    serde_json::from_slice(&bytes).map_err(|e| ApiError::BadRequest(format!("bad JSON body: {e}")))
}

async fn repository_index(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Answer {
    let req = optional_json(&state, &headers, body).await?;
    let ready_only = match req.get("ready") {
        None => false,
        Some(v) => v
            .as_bool()
            .ok_or_else(|| ApiError::BadRequest("\"ready\" must be true or false".into()))?,
    };
    let entries = state.registry.index(ready_only).await.map_err(ApiError::from)?;
    Ok(Json(index_json(&entries)).into_response())
}

/// `POST /v2/repository/models/{m}/rollout`: start a canary rollout, or promote or abort
/// the one in progress. Answers with the rollout's versions and outcome.
async fn rollout(
    State(state): State<AppState>,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    let req = optional_json(&state, &headers, body).await?;
    let action = rollout_action(req)?;
    let status = state
        .registry
        .rollout(&model, action)
        .await
        .map_err(ApiError::from)?;
    Ok(Json(json!({
        "model": model,
        "stable_version": status.stable.to_string(),
        "canary_version": status.canary.to_string(),
        "canary_percent": status.canary_percent,
        "outcome": status.outcome,
    }))
    .into_response())
}

/// A rollout request's body: `{"action": "start" | "promote" | "abort"}`, and for a start
/// an optional `version` and the `[rollout]` keys to use instead of the model's.
fn rollout_action(mut req: Value) -> Result<RolloutAction, ApiError> {
    let bad = |m: String| ApiError::BadRequest(m);
    let obj = req
        .as_object_mut()
        .ok_or_else(|| bad("the rollout request must be a JSON object".into()))?;
    let action = match obj.remove("action") {
        Some(Value::String(a)) => a,
        Some(other) => return Err(bad(format!("\"action\" must be a string, not {other}"))),
        None => {
            return Err(bad(
                "say what to do: \"action\" is one of start, promote, abort".into()
            ))
        }
    };
    let version = match obj.remove("version") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                .ok_or_else(|| bad(format!("\"version\" must be a version number, not {v}")))?,
        ),
    };
    match action.as_str() {
        "start" => {
            let policy: RolloutFile = serde_json::from_value(Value::Object(std::mem::take(obj)))
                .map_err(|e| bad(format!("bad rollout settings: {e}")))?;
            // Each key's range is checked here, so a bad request is a 400 before it queues.
            policy
                .apply(&RolloutPolicy::default())
                .map_err(|e| bad(e.to_string()))?;
            Ok(RolloutAction::Start { version, policy })
        }
        "promote" | "abort" if version.is_some() || !obj.is_empty() => Err(bad(format!(
            "{action} takes no other keys: it ends the rollout in progress"
        ))),
        "promote" => Ok(RolloutAction::Promote),
        "abort" => Ok(RolloutAction::Abort),
        other => Err(bad(format!(
            "\"action\" {other:?} is not one of start, promote, abort"
        ))),
    }
}

/// Load parameters Peregrine cannot honour are refused rather than ignored.
pub fn check_load_parameters<'a>(mut keys: impl Iterator<Item = &'a str>) -> Result<(), ApiError> {
    match keys.next() {
        None => Ok(()),
        Some(k) if k == "config" || k.starts_with("file:") => Err(ApiError::BadRequest(format!(
            "load parameter {k:?} is not supported: put the model's files and config.toml in the repository, then load it by name"
        ))),
        Some(k) => Err(ApiError::BadRequest(format!("unknown load parameter {k:?}"))),
    }
}

async fn load(
    State(state): State<AppState>,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    let req = optional_json(&state, &headers, body).await?;
    if let Some(params) = req.get("parameters").and_then(Value::as_object) {
        check_load_parameters(params.keys().map(String::as_str))?;
    }
    let report = state.registry.load(&model).await.map_err(ApiError::from)?;
    tracing::info!(model = %model, loaded = ?report.loaded, retired = ?report.retired, "model loaded on request");
    Ok(StatusCode::OK.into_response())
}

async fn unload(
    State(state): State<AppState>,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    // `unload_dependents` is accepted and means nothing here: models have no dependents.
    optional_json(&state, &headers, body).await?;
    state.registry.unload(&model).await.map_err(ApiError::from)?;
    Ok(StatusCode::OK.into_response())
}

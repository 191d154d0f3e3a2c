//! Liveness, readiness and the metrics endpoint.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;

use crate::wire::{ModelReady, ReadyBody};
use crate::AppState;

/// The process is up and serving HTTP.
pub async fn live() -> impl IntoResponse {
    (StatusCode::OK, Json(serde_json::json!({ "live": true })))
}

/// 200 while [`AppState::is_ready`]; 503 otherwise, with which model is not ready.
pub async fn ready(State(state): State<AppState>) -> impl IntoResponse {
    let draining = state.drain.is_draining();
    let snapshot = state.registry.snapshot();
    let models: Vec<ModelReady> = snapshot
        .models
        .values()
        .map(|m| {
            let serving = m.engine(None);
            ModelReady {
                name: m.name.clone(),
                version: serving.as_ref().ok().map(|e| e.version().to_string()),
                ready: serving.is_ok(),
                reason: serving.err().map(|e| e.to_string()),
            }
        })
        .collect();
    let ready = state.is_ready();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(ReadyBody {
            ready,
            draining,
            models,
        }),
    )
}

pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}

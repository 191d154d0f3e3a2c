//! Liveness, readiness and the metrics endpoint.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;

use peregrine_engine::telemetry::{self, VersionGauges};

use crate::gauges::{label_value, write_family};
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
    let mut text = state.metrics.render();
    let snapshot = state.registry.snapshot();
    let engines = snapshot
        .models
        .values()
        .flat_map(|m| m.versions.iter().filter_map(|v| v.engine.as_ref()));
    let gauges: Vec<(&str, &str, VersionGauges)> =
        engines.map(|e| (e.name(), e.version(), e.gauges())).collect();
    write_version_gauges(&mut text, &gauges);
    if let Some(gb28181) = &state.gb28181 {
        crate::gb28181::write_gauges(&mut text, &gb28181.devices().await);
    }
    if let Some(gpu) = state.gpu.clone() {
        // A few driver calls per GPU: off the async workers.
        if let Ok(readings) = tokio::task::spawn_blocking(move || gpu.read()).await {
            crate::gpu_metrics::write_gpu_gauges(&mut text, &readings);
        }
    }
    (
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        text,
    )
}

/// Appends the per-version gauges of the versions served now (model, version, gauges), in
/// Prometheus' text format, one family after another. They are read at each scrape, so a
/// retired or unloaded version's series leave with it.
fn write_version_gauges(out: &mut String, versions: &[(&str, &str, VersionGauges)]) {
    type Read = fn(&VersionGauges) -> Option<f64>;
    let families: [(&str, Read); 4] = [
        (telemetry::LATENCY_P99, |g| Some(g.p99.as_secs_f64())),
        (telemetry::LATENCY_OBJECTIVE, |g| {
            g.objective.map(|o| o.as_secs_f64())
        }),
        (telemetry::BATCH_LIMIT, |g| Some(g.batch_limit as f64)),
        (telemetry::BATCH_DELAY, |g| Some(g.batch_delay.as_secs_f64())),
    ];
    for (name, read) in families {
        let samples = versions.iter().filter_map(|(model, version, gauges)| {
            let labels = format!(
                "model=\"{}\",version=\"{}\"",
                label_value(model),
                label_value(version)
            );
            read(gauges).map(|value| (labels, value))
        });
        write_family(out, name, None, samples);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn version_gauges_are_one_family_after_another() {
        let gauges = |objective| VersionGauges {
            p99: Duration::from_millis(25),
            objective,
            batch_limit: 4,
            batch_delay: Duration::from_micros(500),
        };
        let mut out = String::new();
        write_version_gauges(
            &mut out,
            &[
                ("det", "1", gauges(Some(Duration::from_millis(50)))),
                ("o\"dd", "2", gauges(None)),
            ],
        );
        assert_eq!(
            out,
            "# TYPE peregrine_latency_p99_seconds gauge\n\
             peregrine_latency_p99_seconds{model=\"det\",version=\"1\"} 0.025\n\
             peregrine_latency_p99_seconds{model=\"o\\\"dd\",version=\"2\"} 0.025\n\
             # TYPE peregrine_latency_objective_seconds gauge\n\
             peregrine_latency_objective_seconds{model=\"det\",version=\"1\"} 0.05\n\
             # TYPE peregrine_batch_limit gauge\n\
             peregrine_batch_limit{model=\"det\",version=\"1\"} 4\n\
             peregrine_batch_limit{model=\"o\\\"dd\",version=\"2\"} 4\n\
             # TYPE peregrine_batch_delay_seconds gauge\n\
             peregrine_batch_delay_seconds{model=\"det\",version=\"1\"} 0.0005\n\
             peregrine_batch_delay_seconds{model=\"o\\\"dd\",version=\"2\"} 0.0005\n"
        );
        write_version_gauges(&mut out, &[]);
        assert!(out.ends_with("0.0005\n"), "nothing for no versions");
    }
}

//! Liveness, readiness and the metrics endpoint.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;

use peregrine_engine::telemetry::{self, VersionGauges};
use peregrine_engine::{by_device, device_label, InstancePlacement};

use crate::gauges::{label_value, write_family};
use crate::wire::{InstanceJson, ModelReady, ReadyBody};
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
                instances: serving
                    .as_ref()
                    .map(|e| InstanceJson::list(&e.placement()))
                    .unwrap_or_default(),
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
    let engines: Vec<_> = engines.collect();
    let gauges: Vec<(&str, &str, VersionGauges)> = engines
        .iter()
        .map(|e| (e.name(), e.version(), e.gauges()))
        .collect();
    write_version_gauges(&mut text, &gauges);
    let placements: Vec<_> = engines
        .iter()
        .map(|e| (e.name(), e.version(), e.placement()))
        .collect();
    write_instance_gauges(
        &mut text,
        placements.iter().map(|(m, v, p)| (*m, *v, p.as_slice())),
    );
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

/// Appends `peregrine_instances`: each served version's instances per device, serving
/// and retired (a failed GPU's).
fn write_instance_gauges<'a>(
    out: &mut String,
    versions: impl Iterator<Item = (&'a str, &'a str, &'a [InstancePlacement])>,
) {
    let mut samples = Vec::new();
    for (model, version, placement) in versions {
        for (device, (serving, retired)) in by_device(placement) {
            for (state, n) in [("retired", retired), ("serving", serving)] {
                let labels = format!(
                    "model=\"{}\",version=\"{}\",device=\"{}\",state=\"{state}\"",
                    label_value(model),
                    label_value(version),
                    device_label(device)
                );
                samples.push((labels, n as f64));
            }
        }
    }
    write_family(
        out,
        telemetry::INSTANCES,
        Some("Model instances per device: serving, or retired after their GPU failed."),
        samples,
    );
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

    #[test]
    fn instances_are_counted_per_device_and_state() {
        let placement = |device, retired: Option<&str>| InstancePlacement {
            device,
            retired: retired.map(str::to_string),
        };
        let two_gpus = [
            placement(Some(0), None),
            placement(Some(1), Some("GPU 1 failed")),
            placement(Some(0), None),
            placement(Some(1), Some("GPU 1 failed")),
        ];
        let mut out = String::new();
        write_instance_gauges(&mut out, [("det", "1", &two_gpus[..])].into_iter());
        let lines: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            lines,
            [
                "peregrine_instances{model=\"det\",version=\"1\",device=\"gpu0\",state=\"retired\"} 0",
                "peregrine_instances{model=\"det\",version=\"1\",device=\"gpu0\",state=\"serving\"} 2",
                "peregrine_instances{model=\"det\",version=\"1\",device=\"gpu1\",state=\"retired\"} 2",
                "peregrine_instances{model=\"det\",version=\"1\",device=\"gpu1\",state=\"serving\"} 0",
            ]
        );
    }
}

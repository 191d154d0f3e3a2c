//! A stream's analytics over HTTP: its zones and lines (`GET`/`PUT
//! /v1/streams/{name}/zones`, `PUT .../lines`) with who is inside and what crossed, and its
//! newest frame as a JPEG (`.../latest.jpg`) or an MJPEG feed (`.../mjpeg`). Pictures are
//! encoded on the stream's analytics thread only when someone asks.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use peregrine_video::{AnalyticsConfig, AnalyticsReport, ClassSelector, LineConfig, UnitsConfig, ZoneConfig};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::{ApiError, AppState};

/// Most frames per second an MJPEG viewer may ask for.
const MAX_MJPEG_FPS: f64 = 30.0;
const DEFAULT_MJPEG_FPS: f64 = 5.0;
/// The multipart boundary of MJPEG feeds.
const BOUNDARY: &str = "peregrine-frame";

fn classes_json(c: &[ClassSelector]) -> Value {
    Value::Array(
        c.iter()
            .map(|s| match s {
                ClassSelector::Id(id) => json!(id),
                ClassSelector::Name(n) => json!(n),
            })
            .collect(),
    )
}

fn units(u: UnitsConfig) -> &'static str {
    match u {
        UnitsConfig::Pixels => "pixels",
        UnitsConfig::Normalized => "normalized",
    }
}

/// The configured zones and lines with their live state, matched by name.
fn places_json(name: &str, config: &AnalyticsConfig, report: &AnalyticsReport) -> Value {
    let zones: Vec<Value> = config
        .zones
        .iter()
        .map(|z| {
            let live = report.zones.iter().find(|r| r.name == z.name);
            let by_class: Map<String, Value> = live
                .map(|r| r.by_class.iter().map(|(c, n)| (c.clone(), json!(n))).collect())
                .unwrap_or_default();
            json!({
                "name": z.name, "points": z.points, "units": units(z.units),
                "classes": classes_json(&z.classes), "loiter_s": z.loiter_s,
                "objects": live.map_or(0, |r| r.objects), "by_class": by_class,
                "track_ids": live.map(|r| r.track_ids.clone()).unwrap_or_default(),
            })
        })
        .collect();
    let lines: Vec<Value> = config
        .lines
        .iter()
        .map(|l| {
            let live = report.lines.iter().find(|r| r.name == l.name);
            let by_class: Map<String, Value> = live
                .map(|r| {
                    r.by_class
                        .iter()
                        .map(|(c, i, o)| (c.clone(), json!({ "in": i, "out": o })))
                        .collect()
                })
                .unwrap_or_default();
            json!({
                "name": l.name, "start": l.start, "end": l.end, "units": units(l.units),
                "classes": classes_json(&l.classes),
                "in": live.map_or(0, |r| r.total_in), "out": live.map_or(0, |r| r.total_out),
                "by_class": by_class,
            })
        })
        .collect();
    json!({
        "stream": name,
        "tracking": report.tracking,
        "live_tracks": report.live_tracks,
        "anchor": config.anchor,
        "zones": zones,
        "lines": lines,
        "zone_error": report.zone_error,
    })
}

/// `GET /v1/streams/{name}/zones`: zones and lines, occupancy and counts.
pub async fn zones(State(state): State<AppState>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let report = state.streams.analytics(&name).await?;
    let config = state.streams.status(&name).await?.config.analytics;
    Ok(Json(places_json(&name, &config, &report)))
}

fn parse<T: serde::de::DeserializeOwned>(what: &str, body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("bad {what}: {e}")))
}

/// `PUT /v1/streams/{name}/zones`: a JSON array of zones replaces the stream's zones.
pub async fn put_zones(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let zones: Vec<ZoneConfig> = parse("zones (a JSON array of zones)", &body)?;
    state.streams.set_places(&name, Some(zones), None).await?;
    zones_now(&state, &name).await
}

/// `PUT /v1/streams/{name}/lines`: a JSON array of lines replaces the stream's lines.
pub async fn put_lines(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let lines: Vec<LineConfig> = parse("lines (a JSON array of lines)", &body)?;
    state.streams.set_places(&name, None, Some(lines)).await?;
    zones_now(&state, &name).await
}

async fn zones_now(state: &AppState, name: &str) -> Result<Json<Value>, ApiError> {
    zones(State(state.clone()), Path(name.to_string())).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PictureParams {
    #[serde(default)]
    annotate: bool,
    fps: Option<f64>,
}

/// `GET /v1/streams/{name}/latest.jpg[?annotate=true]`.
fn picture_params(p: Result<Query<PictureParams>, QueryRejection>) -> Result<PictureParams, ApiError> {
    p.map(|q| q.0).map_err(|e| ApiError::BadRequest(e.body_text()))
}

pub async fn latest(
    State(state): State<AppState>,
    Path(name): Path<String>,
    p: Result<Query<PictureParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let p = picture_params(p)?;
    if p.fps.is_some() {
        return Err(ApiError::BadRequest("fps applies to .../mjpeg only".into()));
    }
    let picture = state
        .streams
        .latest_picture(&name, p.annotate, None)
        .await?
        .ok_or_else(|| ApiError::NotReady(format!("stream {name:?} has no frame yet")))?;
    Ok((
        [
            (header::CONTENT_TYPE, "image/jpeg".to_string()),
            (header::CACHE_CONTROL, "no-store".to_string()),
            (
                header::HeaderName::from_static("x-frame-seq"),
                picture.seq.to_string(),
            ),
        ],
        picture.jpeg,
    )
        .into_response())
}

/// `GET /v1/streams/{name}/mjpeg[?fps=5&annotate=true]`: `multipart/x-mixed-replace`, one
/// JPEG part per new frame, at most `fps` a second. A slow viewer gets fewer frames: the
/// next one is only encoded once the previous has been taken.
pub async fn mjpeg(
    State(state): State<AppState>,
    Path(name): Path<String>,
    p: Result<Query<PictureParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let p = picture_params(p)?;
    let fps = p.fps.unwrap_or(DEFAULT_MJPEG_FPS);
    if !(fps.is_finite() && fps > 0.0 && fps <= MAX_MJPEG_FPS) {
        return Err(ApiError::BadRequest(format!(
            "fps must be over 0 and at most {MAX_MJPEG_FPS}, not {fps}"
        )));
    }
    // Fails now (404) for a stream that does not exist.
    state.streams.status(&name).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / fps));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = None;
        loop {
            tick.tick().await;
            let picture = match state.streams.latest_picture(&name, p.annotate, last).await {
                Ok(Some(picture)) => picture,
                Ok(None) => continue,
                // The stream was removed: the feed ends.
                Err(_) => return,
            };
            last = Some(picture.seq);
            let head = format!(
                "--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {}\r\n\r\n",
                picture.jpeg.len()
            );
            let mut part = Vec::with_capacity(head.len() + picture.jpeg.len() + 2);
            part.extend_from_slice(head.as_bytes());
            part.extend_from_slice(&picture.jpeg);
            part.extend_from_slice(b"\r\n");
            if tx.send(Ok(Bytes::from(part))).await.is_err() {
                return;
            }
        }
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    Ok((
        [
            (
                header::CONTENT_TYPE,
                format!("multipart/x-mixed-replace; boundary={BOUNDARY}"),
            ),
            (header::CACHE_CONTROL, "no-store".to_string()),
        ],
        body,
    )
        .into_response())
}

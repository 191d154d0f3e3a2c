//! Video streams over HTTP: managing them at run time (`/v1/streams`) and their detections
//! pushed live, as Server-Sent Events (`.../events`) or over a WebSocket (`.../ws`), for
//! one stream or all of them. Event bodies are the video crate's wire schema, the same the
//! MQTT and webhook sinks send. A subscriber that falls behind loses the oldest events,
//! and is told how many; it never slows detection.

use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use peregrine_video::event_json;
use peregrine_video::{EventSubscription, StreamConfig, StreamReport, StreamStatus, StreamSummary};
use serde_json::{json, Value};

use crate::{ApiError, AppState};

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn status_json(s: &StreamStatus) -> Value {
    let mut o = json!({ "state": s.name() });
    match s {
        StreamStatus::Connecting { attempt } => o["attempt"] = json!(attempt),
        StreamStatus::Streaming { since } => o["since_unix_ms"] = json!(unix_ms(*since)),
        StreamStatus::BackingOff {
            last_error,
            attempt,
            next_attempt,
        } => {
            o["last_error"] = json!(last_error);
            o["attempt"] = json!(attempt);
            o["next_attempt_unix_ms"] = json!(unix_ms(*next_attempt));
        }
        StreamStatus::Stopped { reason } => o["reason"] = json!(reason),
    }
    o
}

fn summary_json(s: &StreamSummary) -> Value {
    json!({ "name": s.name, "source": s.source, "status": status_json(&s.status) })
}

fn report_json(r: &StreamReport) -> Value {
    let c = &r.counters;
    let dropped: serde_json::Map<String, Value> = c
        .frames_dropped
        .iter()
        .map(|(reason, n)| (reason.as_str().to_string(), json!(n)))
        .collect();
    let cfg = &r.config;
    json!({
        "name": r.name,
        "source": r.source,
        "status": status_json(&r.status),
        "counters": {
            "frames_received": c.frames_received,
            "frames_decoded": c.frames_decoded,
            "frames_detected": c.frames_detected,
            "frames_dropped": dropped,
            "reconnects": c.reconnects,
        },
        "frames_in_use": r.frames_in_use,
        "frames_on_gpu": r.frames_on_gpu,
        "decoder": {
            "requested": r.decoder.requested.as_str(),
            "gpu": r.decoder.gpu,
            "active": r.decoder.active.map(|a| a.as_str()),
            "reason": r.decoder.reason,
        },
        "config": {
            "url": cfg.url,
            "transport": format!("{:?}", cfg.transport).to_lowercase(),
            "fps": cfg.fps,
            "staleness_ms": cfg.staleness_ms,
            "connect_timeout_ms": cfg.connect_timeout_ms,
            "frame_timeout_ms": cfg.frame_timeout_ms,
            "frame_pool": cfg.frame_pool,
            "detect_in_flight": cfg.detect_in_flight,
            "decoder": cfg.decoder.map(|d| d.as_str()),
            "gpu": cfg.gpu,
            "loop": cfg.looped,
            "realtime": cfg.realtime,
            "analytics": {
                "tracking": cfg.analytics.tracking,
                "anchor": cfg.analytics.anchor,
                "zones": cfg.analytics.zones.iter().map(|z| &z.name).collect::<Vec<_>>(),
                "lines": cfg.analytics.lines.iter().map(|l| &l.name).collect::<Vec<_>>(),
                "snapshots": cfg.analytics.snapshots,
            },
        },
    })
}

/// `GET /v1/streams`: the streams this server runs, its shard, and the configured streams
/// it left to other shards (with the index of the one that runs each).
pub async fn list(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let streams = state.streams.list().await?;
    let placement = state.streams.placement();
    let skipped: Vec<Value> = placement
        .skipped
        .iter()
        .map(|s| json!({ "name": s.name, "owner": s.owner }))
        .collect();
    Ok(Json(json!({
        "streams": streams.iter().map(summary_json).collect::<Vec<_>>(),
        "shard": { "index": placement.shard.index(), "count": placement.shard.count() },
        "skipped": skipped,
    })))
}

/// `POST /v1/streams`: a stream definition, as in the config file's `[[streams]]`.
pub async fn add(State(state): State<AppState>, body: axum::body::Bytes) -> Result<Response, ApiError> {
    let config: StreamConfig = serde_json::from_slice(&body)
        .map_err(|e| ApiError::BadRequest(format!("bad stream definition: {e}")))?;
    let name = config.name.clone();
    state.streams.add(config).await?;
    tracing::info!(stream = %name, "stream added");
    let report = state.streams.status(&name).await?;
    Ok((StatusCode::CREATED, Json(report_json(&report))).into_response())
}

/// `GET /v1/streams/{name}`.
pub async fn status(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(report_json(&state.streams.status(&name).await?)))
}

/// `DELETE /v1/streams/{name}`: answers once the stream's tasks and decoder have ended.
pub async fn remove(State(state): State<AppState>, Path(name): Path<String>) -> Result<StatusCode, ApiError> {
    state.streams.remove(&name).await?;
    tracing::info!(stream = %name, "stream removed");
    Ok(StatusCode::NO_CONTENT)
}

/// Events as they come, with a `lagged` item whenever some were lost to a slow reader. A
/// task feeds a small bounded channel: it waits when the reader is slow, and the
/// subscription behind it drops the oldest events instead of holding detection up.
fn feed(mut events: EventSubscription) -> tokio_stream::wrappers::ReceiverStream<FeedItem> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        let mut missed = 0;
        while let Some(event) = events.recv().await {
            let now_missed = events.missed();
            if now_missed > missed {
                if tx.send(FeedItem::Lagged(now_missed - missed)).await.is_err() {
                    return;
                }
                missed = now_missed;
            }
            if tx.send(FeedItem::Detection(event_json(&event))).await.is_err() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

enum FeedItem {
    Detection(Vec<u8>),
    Lagged(u64),
}

async fn subscription(state: &AppState, name: Option<&str>) -> Result<EventSubscription, ApiError> {
    Ok(match name {
        Some(n) => state.streams.subscribe(n).await?,
        None => state.streams.subscribe_all().await?,
    })
}

fn sse(events: EventSubscription) -> impl IntoResponse {
    let stream = futures_util::StreamExt::map(feed(events), |item| {
        Ok::<_, Infallible>(match item {
            FeedItem::Detection(body) => Event::default()
                .event("detection")
                .data(String::from_utf8_lossy(&body)),
            FeedItem::Lagged(n) => Event::default()
                .event("lagged")
                .data(json!({ "missed": n }).to_string()),
        })
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// `GET /v1/streams/events`: every stream's detections, as Server-Sent Events.
pub async fn events_all(State(state): State<AppState>) -> Result<Response, ApiError> {
    Ok(sse(subscription(&state, None).await?).into_response())
}

/// `GET /v1/streams/{name}/events`.
pub async fn events_one(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    Ok(sse(subscription(&state, Some(&name)).await?).into_response())
}

/// Sends events until the client goes away. The client's own messages are read too, so
/// its close handshake is answered and a closed socket ends the subscription at once.
async fn pump(mut socket: WebSocket, events: EventSubscription) {
    let mut feed = feed(events);
    loop {
        tokio::select! {
            incoming = socket.recv() => match incoming {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => {}
            },
            item = futures_util::StreamExt::next(&mut feed) => {
                let text = match item {
                    None => return,
                    Some(FeedItem::Detection(body)) => String::from_utf8_lossy(&body).into_owned(),
                    Some(FeedItem::Lagged(n)) => json!({ "lagged": n }).to_string(),
                };
                if socket.send(Message::Text(text.into())).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// `GET /v1/streams/ws`: every stream's detections over a WebSocket, one JSON text
/// message each.
pub async fn ws_all(State(state): State<AppState>, upgrade: WebSocketUpgrade) -> Result<Response, ApiError> {
    let events = subscription(&state, None).await?;
    Ok(upgrade.on_upgrade(move |socket| pump(socket, events)))
}

/// `GET /v1/streams/{name}/ws`.
pub async fn ws_one(
    State(state): State<AppState>,
    Path(name): Path<String>,
    upgrade: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let events = subscription(&state, Some(&name)).await?;
    Ok(upgrade.on_upgrade(move |socket| pump(socket, events)))
}

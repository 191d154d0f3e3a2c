//! Object events over HTTP: the stored history (`/v1/events`, paged newest first, from
//! the event store) and the live feed (`/v1/events/stream`, Server-Sent Events). Bodies are
//! the video crate's object event JSON, stored as it was published.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use peregrine_eventstore::{Cursor, EventQuery, EventStore, StoredEvent};
use peregrine_video::{object_json, ObjectEventKind};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{ApiError, AppState};

/// `GET /v1/events` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsParams {
    stream: Option<String>,
    label: Option<String>,
    zone: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    /// Capture time from (inclusive): unix milliseconds or RFC 3339.
    after: Option<String>,
    /// Capture time up to (exclusive).
    before: Option<String>,
    limit: Option<usize>,
    cursor: Option<String>,
}

fn store(state: &AppState) -> Result<EventStore, ApiError> {
    state.events.clone().ok_or(ApiError::EventsOff)
}

/// A time parameter as unix milliseconds.
fn time_ms(name: &str, value: Option<&str>) -> Result<Option<i64>, ApiError> {
    let Some(v) = value else { return Ok(None) };
    if let Ok(ms) = v.parse::<i64>() {
        return Ok(Some(ms));
    }
    v.parse::<jiff::Timestamp>()
        .map(|t| Some(t.as_millisecond()))
        .map_err(|_| {
            ApiError::BadRequest(format!(
                "{name}={v:?} is neither unix milliseconds nor an RFC 3339 time"
            ))
        })
}

impl EventsParams {
    fn query(self) -> Result<EventQuery, ApiError> {
        if let Some(k) = &self.kind {
            if !ObjectEventKind::NAMES.contains(&k.as_str()) {
                return Err(ApiError::BadRequest(format!(
                    "type={k:?} is not an event type; one of {}",
                    ObjectEventKind::NAMES.join(", ")
                )));
            }
        }
        let cursor = self
            .cursor
            .as_deref()
            .map(str::parse::<Cursor>)
            .transpose()
            .map_err(|e| ApiError::BadRequest(e.to_string()))?;
        let query = EventQuery {
            after_ms: time_ms("after", self.after.as_deref())?,
            before_ms: time_ms("before", self.before.as_deref())?,
            stream: self.stream,
            label: self.label,
            zone: self.zone,
            kind: self.kind,
            limit: self.limit.unwrap_or(EventQuery::default().limit),
            cursor,
        };
        query.validate()?;
        Ok(query)
    }
}

/// The stored JSON of an event (as published), parsed for embedding.
fn event_value(e: &StoredEvent) -> Value {
    serde_json::from_str(&e.payload)
        .unwrap_or_else(|_| json!({ "id": e.id, "type": e.kind, "stream": e.stream }))
}

/// Runs a store call on the blocking pool (SQLite reads wait on disk).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, peregrine_eventstore::StoreError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::Internal(format!("event store task failed: {e}")))?
        .map_err(ApiError::from)
}

/// `GET /v1/events`: newest first; `next_cursor` fetches the page after.
pub async fn list(
    State(state): State<AppState>,
    params: Result<Query<EventsParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let store = store(&state)?;
    let query = params
        .map_err(|e| ApiError::BadRequest(e.body_text()))?
        .0
        .query()?;
    let page = blocking(move || store.query(&query)).await?;
    Ok(Json(json!({
        "events": page.events.iter().map(event_value).collect::<Vec<_>>(),
        "next_cursor": page.next.map(|c| c.to_string()),
    })))
}

fn not_found(id: &str) -> ApiError {
    ApiError::Missing(format!("no event {id:?}"))
}

/// `GET /v1/events/{id}`.
pub async fn get(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let store = store(&state)?;
    let wanted = id.clone();
    let event = blocking(move || store.get(&wanted))
        .await?
        .ok_or_else(|| not_found(&id))?;
    Ok(Json(event_value(&event)))
}

/// `DELETE /v1/events/{id}`: the event and its snapshot.
pub async fn delete(State(state): State<AppState>, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    let store = store(&state)?;
    let wanted = id.clone();
    match blocking(move || store.delete(&wanted)).await? {
        true => Ok(StatusCode::NO_CONTENT),
        false => Err(not_found(&id)),
    }
}

/// `GET /v1/events/{id}/snapshot.jpg`.
pub async fn snapshot(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let store = store(&state)?;
    let wanted = id.clone();
    let event = blocking(move || store.get(&wanted))
        .await?
        .ok_or_else(|| not_found(&id))?;
    let no_picture = || ApiError::Missing(format!("event {id:?} has no snapshot"));
    let path = event.snapshot.ok_or_else(no_picture)?;
    // Retention may have removed the file since the row was read.
    let bytes = tokio::task::spawn_blocking(move || std::fs::read(path))
        .await
        .map_err(|e| ApiError::Internal(format!("reading a snapshot failed: {e}")))?
        .map_err(|_| no_picture())?;
    Ok(([(header::CONTENT_TYPE, "image/jpeg")], bytes).into_response())
}

/// `GET /v1/events/stream`: object events as they happen, as SSE (`event: object`, or
/// `lagged` with the number lost when this reader fell behind).
pub async fn stream(State(state): State<AppState>) -> Result<Response, ApiError> {
    let mut events = state.streams.subscribe_objects().await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Event>(16);
    tokio::spawn(async move {
        let mut missed = 0;
        while let Some(event) = events.recv().await {
            if events.missed() > missed {
                let lost = events.missed() - missed;
                missed = events.missed();
                if tx
                    .send(Event::default().event("lagged").data(lost.to_string()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            let body = String::from_utf8(object_json(
                &event,
                event.snapshot.is_some() && state.events.is_some(),
            ))
            .unwrap_or_default();
            if tx
                .send(Event::default().event("object").data(body))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let items = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::ReceiverStream::new(rx),
        Ok::<_, Infallible>,
    );
    Ok(Sse::new(items)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

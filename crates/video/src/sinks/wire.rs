//! The JSON that MQTT and webhooks carry; the only place events become bytes.
//!
//! A detection event (`schema_version` 3; fields are only ever added; 2 added `track_id`,
//! 3 the `object.update` event and the `before` and `after` of object events):
//!
//! ```json
//! {
//!   "schema_version": 3,
//!   "stream": "cam1",
//!   "seq": 1234,
//!   "pts_seconds": 49.36,
//!   "pts_90k": 4442400,
//!   "capture_time": "2026-12-01T09:30:00.123Z",
//!   "capture_unix_ms": 1796117400123,
//!   "clock_source": "rtcp",
//!   "width": 1280,
//!   "height": 720,
//!   "detections": [
//!     {"class_id": 0, "class_name": "person", "score": 0.91, "box": [12.5, 40.0, 210.0, 700.2],
//!      "track_id": 17}
//!   ],
//!   "latency_ms": 87.4
//! }
//! ```
//!
//! `seq` counts decoded frames on the stream (gaps are frames that were sampled out or
//! dropped); `pts_*` is the stream's presentation time from its start; `capture_*` is when
//! the frame was captured, by the camera's clock through RTCP sender reports
//! (`clock_source` `"rtcp"`), for a pushed RTP stream by its RTP timestamps counted from
//! the arrival of its first packet (`"rtp"`), or else when this server received it
//! (`"local"`);
//! `box` is `[x1, y1, x2, y2]` in the frame's pixels; `latency_ms` is glass to result;
//! `track_id` is present on detections that belong to a confirmed track (streams that
//! track objects) and is stable while the object is tracked.
//!
//! An object event (`type` one of `object.start`, `object.update`, `object.end`,
//! `zone.enter`, `zone.exit`, `zone.loiter`, `line.cross`):
//!
//! ```json
//! {
//!   "schema_version": 3, "id": "019ad2c4-7d0e-7c3a-9f1e-3b8c2d1e4f50", "type": "line.cross",
//!   "stream": "cam1", "track_id": 17, "class_id": 0, "label": "person", "score": 0.91,
//!   "box": [12.5, 40.0, 210.0, 700.2], "width": 1280, "height": 720,
//!   "capture_time": "2026-12-01T09:30:00.123Z", "capture_unix_ms": 1796117400123,
//!   "clock_source": "rtcp", "pts_seconds": 49.36,
//!   "line": "gate", "direction": "in", "snapshot_url": "/v1/events/019ad2c4-.../snapshot.jpg"
//! }
//! ```
//!
//! Kind-specific fields: `zone` (zone events), `line` and `direction` (`line.cross`),
//! `inside_s` (`zone.loiter`), `first_seen_unix_ms`, `last_seen_unix_ms`, `duration_s` and
//! `best_score` (`object.end`, whose `score` is also the best). `snapshot_url` is present
//! when the event has a snapshot that the event store keeps (never on `object.update`,
//! which is not stored).
//!
//! `object.start`, `object.update` and `object.end` also carry the object `before` and
//! `after` the event, as Frigate's `events` topic does (on `object.start` the two are
//! equal; each `before` is the previous such event's `after`):
//!
//! ```json
//! "after": {"class_id": 0, "label": "person", "score": 0.88, "top_score": 0.93,
//!   "box": [12.5, 40.0, 210.0, 700.2], "current_zones": ["dock"], "entered_zones": ["dock"],
//!   "loitering_zones": [], "stationary": false, "has_snapshot": true,
//!   "snapshot_score": 0.93, "first_seen_unix_ms": 1796117391123,
//!   "last_seen_unix_ms": 1796117400123}
//! ```
//!
//! An `object.update` goes out when something in the object a consumer acts on has changed
//! (label, `top_score` by 0.05 or more, a new best snapshot, zones, loitering, stationary),
//! at most once per object per `update_interval_s`; its top-level `score`, `box` and
//! `label` are `after`'s.
//!
//! A status message: `{"schema_version": 3, "stream": "cam1", "status": "backing_off",
//! "since_unix_ms"?, "last_error"?, "next_attempt_unix_ms"?, "attempt"?, "reason"?}`.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::event::{DetectionEvent, ObjectEvent, ObjectEventKind, ObjectState, StatusChange, StreamStatus};

pub const SCHEMA_VERSION: u32 = 3;

#[derive(Serialize)]
struct EventJson<'a> {
    schema_version: u32,
    stream: &'a str,
    seq: u64,
    pts_seconds: f64,
    pts_90k: i64,
    capture_time: String,
    capture_unix_ms: i64,
    clock_source: &'static str,
    width: u32,
    height: u32,
    detections: Vec<DetectionJson<'a>>,
    latency_ms: f64,
}

#[derive(Serialize)]
struct DetectionJson<'a> {
    class_id: u32,
    class_name: std::borrow::Cow<'a, str>,
    score: f32,
    #[serde(rename = "box")]
    bbox: [f32; 4],
    #[serde(skip_serializing_if = "Option::is_none")]
    track_id: Option<u64>,
}

pub(crate) fn unix_ms(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

fn rfc3339_ms(unix_ms: i64) -> String {
    jiff::Timestamp::from_millisecond(unix_ms)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// A detection event as JSON bytes.
pub fn event_json(event: &DetectionEvent) -> Vec<u8> {
    let capture_ms = unix_ms(event.capture.wall);
    let body = EventJson {
        schema_version: SCHEMA_VERSION,
        stream: &event.stream,
        seq: event.seq,
        pts_seconds: event.pts.seconds,
        pts_90k: event.pts.ticks_90k,
        capture_time: rfc3339_ms(capture_ms),
        capture_unix_ms: capture_ms,
        clock_source: event.capture.source.as_str(),
        width: event.width,
        height: event.height,
        detections: event
            .detections
            .iter()
            .enumerate()
            .map(|(i, d)| DetectionJson {
                class_id: d.class_id,
                class_name: event.class_names.name(d.class_id),
                score: d.score,
                bbox: [d.bbox.x1, d.bbox.y1, d.bbox.x2, d.bbox.y2],
                track_id: event.track_ids.get(i).copied().flatten(),
            })
            .collect(),
        latency_ms: event.latency.as_secs_f64() * 1000.0,
    };
    // Serialising plain numbers and strings cannot fail; an empty body would be a bug.
    serde_json::to_vec(&body).unwrap_or_default()
}

#[derive(Serialize)]
struct ObjectJson<'a> {
    schema_version: u32,
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    stream: &'a str,
    track_id: u64,
    class_id: u32,
    label: &'a str,
    score: f32,
    #[serde(rename = "box")]
    bbox: [f32; 4],
    width: u32,
    height: u32,
    capture_time: String,
    capture_unix_ms: i64,
    clock_source: &'static str,
    pts_seconds: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    zone: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    direction: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    inside_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_seen_unix_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_seen_unix_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    best_score: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    snapshot_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    before: Option<StateJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    after: Option<StateJson<'a>>,
}

#[derive(Serialize)]
struct StateJson<'a> {
    class_id: u32,
    label: &'a str,
    score: f32,
    top_score: f32,
    #[serde(rename = "box")]
    bbox: [f32; 4],
    current_zones: &'a [String],
    entered_zones: &'a [String],
    loitering_zones: &'a [String],
    stationary: bool,
    has_snapshot: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    snapshot_score: Option<f32>,
    first_seen_unix_ms: i64,
    last_seen_unix_ms: i64,
}

impl<'a> StateJson<'a> {
    fn of(s: &'a ObjectState) -> Self {
        Self {
            class_id: s.class_id,
            label: &s.label,
            score: s.score,
            top_score: s.top_score,
            bbox: [s.bbox.x1, s.bbox.y1, s.bbox.x2, s.bbox.y2],
            current_zones: &s.current_zones,
            entered_zones: &s.entered_zones,
            loitering_zones: &s.loitering_zones,
            stationary: s.stationary,
            has_snapshot: s.snapshot_score.is_some(),
            snapshot_score: s.snapshot_score,
            first_seen_unix_ms: unix_ms(s.first_seen),
            last_seen_unix_ms: unix_ms(s.last_seen),
        }
    }
}

/// Where the API serves an event's snapshot.
pub fn snapshot_url(id: &str) -> String {
    format!("/v1/events/{id}/snapshot.jpg")
}

/// An object event as a sink (MQTT, webhooks) sends it: with a `snapshot_url` only when it
/// has a snapshot and `snapshots_served` (the event store keeps snapshots, so the API
/// answers that URL; without a store it would be a 404).
pub fn sink_object_json(event: &ObjectEvent, snapshots_served: bool) -> Vec<u8> {
    object_json(event, snapshots_served && event.snapshot.is_some())
}

/// An object event as JSON bytes. `has_snapshot`: whether a snapshot is (or will be)
/// stored for it; the store keeps the same JSON, so it says so even after the bytes left.
/// Kinds the store does not keep (`object.update`) never link one.
pub fn object_json(event: &ObjectEvent, has_snapshot: bool) -> Vec<u8> {
    let has_snapshot = has_snapshot && event.kind.stored();
    let capture_ms = unix_ms(event.capture.wall);
    let mut body = ObjectJson {
        schema_version: SCHEMA_VERSION,
        id: &event.id,
        kind: event.kind.name(),
        stream: &event.stream,
        track_id: event.track_id,
        class_id: event.class_id,
        label: &event.label,
        score: event.score,
        bbox: [event.bbox.x1, event.bbox.y1, event.bbox.x2, event.bbox.y2],
        width: event.width,
        height: event.height,
        capture_time: rfc3339_ms(capture_ms),
        capture_unix_ms: capture_ms,
        clock_source: event.capture.source.as_str(),
        pts_seconds: event.pts.seconds,
        zone: None,
        line: None,
        direction: None,
        inside_s: None,
        first_seen_unix_ms: None,
        last_seen_unix_ms: None,
        duration_s: None,
        best_score: None,
        snapshot_url: has_snapshot.then(|| snapshot_url(&event.id)),
        before: event.change.as_ref().map(|c| StateJson::of(&c.before)),
        after: event.change.as_ref().map(|c| StateJson::of(&c.after)),
    };
    match &event.kind {
        ObjectEventKind::Start | ObjectEventKind::Update => {}
        ObjectEventKind::End {
            first_seen,
            last_seen,
            best_score,
        } => {
            body.first_seen_unix_ms = Some(unix_ms(*first_seen));
            body.last_seen_unix_ms = Some(unix_ms(*last_seen));
            body.duration_s = Some(
                last_seen
                    .duration_since(*first_seen)
                    .unwrap_or_default()
                    .as_secs_f64(),
            );
            body.best_score = Some(*best_score);
        }
        ObjectEventKind::ZoneEnter { zone } | ObjectEventKind::ZoneExit { zone } => body.zone = Some(zone),
        ObjectEventKind::ZoneLoiter { zone, inside_for } => {
            body.zone = Some(zone);
            body.inside_s = Some(inside_for.as_secs_f64());
        }
        ObjectEventKind::LineCross { line, direction } => {
            body.line = Some(line);
            body.direction = Some(direction.as_str());
        }
    }
    serde_json::to_vec(&body).unwrap_or_default()
}

#[derive(Serialize)]
struct StatusJson<'a> {
    schema_version: u32,
    stream: &'a str,
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    since_unix_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_attempt_unix_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attempt: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
}

/// A status change as JSON bytes.
pub fn status_json(change: &StatusChange) -> Vec<u8> {
    let mut body = StatusJson {
        schema_version: SCHEMA_VERSION,
        stream: &change.stream,
        status: change.status.name(),
        since_unix_ms: None,
        last_error: None,
        next_attempt_unix_ms: None,
        attempt: None,
        reason: None,
    };
    match &change.status {
        StreamStatus::Connecting { attempt } => body.attempt = Some(*attempt),
        StreamStatus::Streaming { since } => body.since_unix_ms = Some(unix_ms(*since)),
        StreamStatus::BackingOff {
            last_error,
            attempt,
            next_attempt,
        } => {
            body.last_error = Some(last_error);
            body.attempt = Some(*attempt);
            body.next_attempt_unix_ms = Some(unix_ms(*next_attempt));
        }
        StreamStatus::Stopped { reason } => body.reason = Some(reason),
    }
    serde_json::to_vec(&body).unwrap_or_default()
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use peregrine_types::{BBox, ClassNames, Detection};

    use super::*;
    use crate::frame::{CaptureTime, ClockSource, Pts};

    pub(crate) fn event(seq: u64) -> DetectionEvent {
        DetectionEvent {
            stream: "cam1".into(),
            seq,
            pts: Pts::from_90k(450_000),
            capture: CaptureTime {
                wall: UNIX_EPOCH + Duration::from_millis(1_796_117_400_123),
                source: ClockSource::RtcpSenderReport,
                received: tokio::time::Instant::now(),
            },
            width: 1280,
            height: 720,
            detections: vec![
                Detection {
                    class_id: 0,
                    score: 0.5,
                    bbox: BBox::new(1.0, 2.0, 3.0, 4.0),
                },
                Detection {
                    class_id: 99,
                    score: 0.25,
                    bbox: BBox::new(0.0, 0.0, 8.0, 8.0),
                },
            ],
            track_ids: vec![Some(17), None],
            class_names: ClassNames::new(vec!["person".into()]),
            published: UNIX_EPOCH,
            latency: Duration::from_micros(87_500),
        }
    }

    #[test]
    fn event_schema_is_stable() {
        let v: serde_json::Value = serde_json::from_slice(&event_json(&event(7))).unwrap();
        let expected = serde_json::json!({
            "schema_version": 3,
            "stream": "cam1",
            "seq": 7,
            "pts_seconds": 5.0,
            "pts_90k": 450000,
            "capture_time": "2026-12-01T09:30:00.123Z",
            "capture_unix_ms": 1796117400123i64,
            "clock_source": "rtcp",
            "width": 1280,
            "height": 720,
            "detections": [
                {"class_id": 0, "class_name": "person", "score": 0.5, "box": [1.0, 2.0, 3.0, 4.0], "track_id": 17},
                {"class_id": 99, "class_name": "class99", "score": 0.25, "box": [0.0, 0.0, 8.0, 8.0]}
            ],
            "latency_ms": 87.5
        });
        assert_eq!(v, expected);
    }

    #[test]
    fn status_schema_names_the_state_and_its_details() {
        let change = StatusChange {
            stream: "cam1".into(),
            status: StreamStatus::BackingOff {
                last_error: "refused".into(),
                attempt: 3,
                next_attempt: UNIX_EPOCH + Duration::from_millis(5),
            },
        };
        let v: serde_json::Value = serde_json::from_slice(&status_json(&change)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"schema_version": 3, "stream": "cam1", "status": "backing_off",
                "last_error": "refused", "attempt": 3, "next_attempt_unix_ms": 5})
        );
    }

    pub(crate) fn object(kind: ObjectEventKind) -> ObjectEvent {
        let base = event(1);
        ObjectEvent {
            id: "019ad2c4-7d0e-7c3a-9f1e-3b8c2d1e4f50".into(),
            stream: base.stream,
            kind,
            track_id: 17,
            class_id: 0,
            label: "person".into(),
            score: 0.5,
            bbox: BBox::new(1.0, 2.0, 3.0, 4.0),
            pts: base.pts,
            capture: base.capture,
            width: 1280,
            height: 720,
            snapshot: None,
            change: None,
        }
    }

    #[test]
    fn object_events_carry_their_kind_and_its_fields() {
        use crate::event::CrossDirection;
        let cross = object(ObjectEventKind::LineCross {
            line: "gate".into(),
            direction: CrossDirection::In,
        });
        let v: serde_json::Value = serde_json::from_slice(&object_json(&cross, true)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "schema_version": 3, "id": "019ad2c4-7d0e-7c3a-9f1e-3b8c2d1e4f50",
                "type": "line.cross", "stream": "cam1", "track_id": 17, "class_id": 0,
                "label": "person", "score": 0.5, "box": [1.0, 2.0, 3.0, 4.0],
                "width": 1280, "height": 720, "capture_time": "2026-12-01T09:30:00.123Z",
                "capture_unix_ms": 1796117400123i64, "clock_source": "rtcp", "pts_seconds": 5.0,
                "line": "gate", "direction": "in",
                "snapshot_url": "/v1/events/019ad2c4-7d0e-7c3a-9f1e-3b8c2d1e4f50/snapshot.jpg"
            })
        );
        let first = UNIX_EPOCH + Duration::from_secs(100);
        let end = object(ObjectEventKind::End {
            first_seen: first,
            last_seen: first + Duration::from_millis(2500),
            best_score: 0.75,
        });
        let v: serde_json::Value = serde_json::from_slice(&object_json(&end, false)).unwrap();
        assert_eq!(v["type"], "object.end");
        assert_eq!(v["duration_s"], 2.5);
        assert_eq!(v["first_seen_unix_ms"], 100_000);
        assert_eq!(v["best_score"], 0.75);
        assert!(v.get("snapshot_url").is_none() && v.get("zone").is_none());
    }

    #[test]
    fn sinks_link_a_snapshot_only_when_the_store_serves_it() {
        let mut start = object(ObjectEventKind::Start);
        let link = |e: &ObjectEvent, served| {
            let v: serde_json::Value = serde_json::from_slice(&sink_object_json(e, served)).unwrap();
            v.get("snapshot_url").cloned()
        };
        assert_eq!(link(&start, true), None, "no snapshot taken");
        start.snapshot = Some(Arc::new(vec![0xff, 0xd8]));
        assert_eq!(link(&start, false), None, "no store to serve it");
        assert_eq!(
            link(&start, true).unwrap(),
            "/v1/events/019ad2c4-7d0e-7c3a-9f1e-3b8c2d1e4f50/snapshot.jpg"
        );
    }

    #[test]
    fn updates_carry_before_and_after_and_link_no_snapshot() {
        use crate::event::{ObjectChange, ObjectState};
        let before = ObjectState {
            class_id: 0,
            label: "person".into(),
            score: 0.5,
            bbox: BBox::new(1.0, 2.0, 3.0, 4.0),
            top_score: 0.5,
            current_zones: Vec::new(),
            entered_zones: Vec::new(),
            loitering_zones: Vec::new(),
            stationary: false,
            snapshot_score: None,
            first_seen: UNIX_EPOCH + Duration::from_secs(90),
            last_seen: UNIX_EPOCH + Duration::from_secs(95),
        };
        let after = ObjectState {
            top_score: 0.75,
            current_zones: vec!["dock".into()],
            entered_zones: vec!["dock".into()],
            stationary: true,
            snapshot_score: Some(0.75),
            last_seen: UNIX_EPOCH + Duration::from_secs(100),
            ..before.clone()
        };
        let mut update = object(ObjectEventKind::Update);
        update.snapshot = Some(Arc::new(vec![0xff, 0xd8]));
        update.change = Some(Box::new(ObjectChange { before, after }));
        let v: serde_json::Value = serde_json::from_slice(&sink_object_json(&update, true)).unwrap();
        assert_eq!(v["type"], "object.update");
        assert!(v.get("snapshot_url").is_none(), "updates are not stored: {v}");
        assert_eq!(
            v["before"],
            serde_json::json!({"class_id": 0, "label": "person", "score": 0.5, "top_score": 0.5,
                "box": [1.0, 2.0, 3.0, 4.0], "current_zones": [], "entered_zones": [],
                "loitering_zones": [], "stationary": false, "has_snapshot": false,
                "first_seen_unix_ms": 90_000, "last_seen_unix_ms": 95_000})
        );
        assert_eq!(
            v["after"],
            serde_json::json!({"class_id": 0, "label": "person", "score": 0.5, "top_score": 0.75,
                "box": [1.0, 2.0, 3.0, 4.0], "current_zones": ["dock"], "entered_zones": ["dock"],
                "loitering_zones": [], "stationary": true, "has_snapshot": true,
                "snapshot_score": 0.75, "first_seen_unix_ms": 90_000, "last_seen_unix_ms": 100_000})
        );
        let zone = object(ObjectEventKind::ZoneEnter { zone: "dock".into() });
        let v: serde_json::Value = serde_json::from_slice(&object_json(&zone, false)).unwrap();
        assert!(v.get("before").is_none() && v.get("after").is_none(), "{v}");
    }
}

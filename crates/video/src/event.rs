//! Results as plain data: the detections of one frame, a stream's status and what sinks
//! receive. How they travel (broadcasts, sink queues) is [`crate::fanout`]'s business.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use peregrine_types::{BBox, ClassNames, Detection};

use crate::frame::{CaptureTime, Pts};

/// The detections of one frame.
#[derive(Debug, Clone)]
pub struct DetectionEvent {
    pub stream: Arc<str>,
    /// The frame's sequence number on its stream (frames decoded before it).
    pub seq: u64,
    pub pts: Pts,
    pub capture: CaptureTime,
    pub width: u32,
    pub height: u32,
    /// In the frame's pixels, best first.
    pub detections: Vec<Detection>,
    /// One per detection, same order: the object it belongs to, when the stream tracks
    /// objects and the detection is part of a confirmed track.
    pub track_ids: Vec<Option<u64>>,
    /// Names for the `class_id`s, from the model that produced them.
    pub class_names: ClassNames,
    /// Wall clock when the result was published.
    pub published: SystemTime,
    /// Glass to result: `published - capture.wall` (zero if the camera's clock is ahead).
    pub latency: Duration,
}

/// A stream's status changed (connected, lost, backing off, removed).
#[derive(Debug, Clone)]
pub struct StatusChange {
    pub stream: Arc<str>,
    pub status: StreamStatus,
}

/// What sinks receive.
#[derive(Debug, Clone)]
pub enum SinkMessage {
    Detection(Arc<DetectionEvent>),
    Status(StatusChange),
    /// Something happened to a tracked object (it appeared, left, entered a zone, ...).
    Object(Arc<ObjectEvent>),
}

/// Something that happened to one tracked object, worth keeping: the event store, MQTT's
/// `events` topic and webhooks get these.
#[derive(Debug, Clone)]
pub struct ObjectEvent {
    /// Unique and time-ordered (a UUIDv7): known before anything stores the event.
    pub id: Arc<str>,
    pub stream: Arc<str>,
    pub kind: ObjectEventKind,
    /// The object's id on its stream.
    pub track_id: u64,
    pub class_id: u32,
    pub label: String,
    /// The detection's score in the frame of the event (for `object.end`, its best).
    pub score: f32,
    /// In the frame's pixels.
    pub bbox: BBox,
    pub pts: Pts,
    pub capture: CaptureTime,
    pub width: u32,
    pub height: u32,
    /// The frame of the event, boxed and labelled, as a JPEG (for `object.end`, the frame
    /// where the object scored best; for `object.update`, a new best snapshot, if it has
    /// one since the last event). Only made when the stream keeps snapshots.
    pub snapshot: Option<Arc<Vec<u8>>>,
    /// The object before and after the event, for `object.start` (the two are equal),
    /// `object.update` and `object.end`; each `before` is the previous event's `after`.
    pub change: Option<Box<ObjectChange>>,
}

/// What consumers were last told about an object, and what it is like now.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectChange {
    pub before: ObjectState,
    pub after: ObjectState,
}

/// A tracked object as consumers see it at one moment (Frigate's event `before`/`after`).
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectState {
    /// The class of its best-scoring detection (it can change when tracking is not
    /// class-aware), and its name.
    pub class_id: u32,
    pub label: String,
    /// Its latest detection's score and box (frame pixels).
    pub score: f32,
    pub bbox: BBox,
    /// Its best score so far.
    pub top_score: f32,
    /// The zones it is in now, in the order it entered them.
    pub current_zones: Vec<String>,
    /// Every zone it has entered so far, in the order of first entry.
    pub entered_zones: Vec<String>,
    /// The zones it is in for longer than their `loiter_s` (it loiters while this is not
    /// empty).
    pub loitering_zones: Vec<String>,
    /// Its box has stayed where it stopped for the stream's `stationary_s`.
    pub stationary: bool,
    /// The score of its best snapshot (none: no snapshot taken).
    pub snapshot_score: Option<f32>,
    /// Capture times of its first and latest detections.
    pub first_seen: SystemTime,
    pub last_seen: SystemTime,
}

/// Which kind of [`ObjectEvent`].
#[derive(Debug, Clone, PartialEq)]
pub enum ObjectEventKind {
    /// A new track was confirmed.
    Start,
    /// Something consumers act on changed since the last event about the object (a better
    /// score or snapshot, its zones, loitering, stationary, its label); at most one per
    /// object per `update_interval_s`. Published, not stored.
    Update,
    /// A track ended (lost for longer than the tracker's budget, or the stream stopped).
    End {
        first_seen: SystemTime,
        last_seen: SystemTime,
        best_score: f32,
    },
    ZoneEnter {
        zone: String,
    },
    ZoneExit {
        zone: String,
    },
    /// Inside `zone` longer than its `loiter` setting (once per stay).
    ZoneLoiter {
        zone: String,
        inside_for: Duration,
    },
    LineCross {
        line: String,
        direction: CrossDirection,
    },
}

/// Which way an object crossed a line (see the line's definition for which side is in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrossDirection {
    In,
    Out,
}

impl CrossDirection {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::In => "in",
            Self::Out => "out",
        }
    }
}

impl ObjectEventKind {
    /// The event's type as the API, the store and MQTT name it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Start => "object.start",
            Self::Update => "object.update",
            Self::End { .. } => "object.end",
            Self::ZoneEnter { .. } => "zone.enter",
            Self::ZoneExit { .. } => "zone.exit",
            Self::ZoneLoiter { .. } => "zone.loiter",
            Self::LineCross { .. } => "line.cross",
        }
    }

    /// The zone or line the event is about.
    pub fn place(&self) -> Option<&str> {
        match self {
            Self::Start | Self::Update | Self::End { .. } => None,
            Self::ZoneEnter { zone } | Self::ZoneExit { zone } | Self::ZoneLoiter { zone, .. } => Some(zone),
            Self::LineCross { line, .. } => Some(line),
        }
    }

    /// Whether the event store keeps events of this kind: all but `object.update`, a
    /// progress report that the next update or the object's end supersedes (the end carries
    /// the final state and the best snapshot).
    pub fn stored(&self) -> bool {
        !matches!(self, Self::Update)
    }

    /// Every type the event store keeps, for validating queries (`object.update` is
    /// published, not stored).
    pub const NAMES: [&'static str; 6] = [
        "object.start",
        "object.end",
        "zone.enter",
        "zone.exit",
        "zone.loiter",
        "line.cross",
    ];
}

/// Where a stream is in its life.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamStatus {
    /// Opening the source (`attempt` counts from 1 since the last healthy connection).
    Connecting { attempt: u32 },
    /// Frames are arriving.
    Streaming { since: SystemTime },
    /// The last attempt failed; the next starts at `next_attempt`.
    BackingOff {
        last_error: String,
        attempt: u32,
        next_attempt: SystemTime,
    },
    /// No more attempts: removed, shut down, or a file that does not loop has ended.
    Stopped { reason: String },
}

impl StreamStatus {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Connecting { .. } => "connecting",
            Self::Streaming { .. } => "streaming",
            Self::BackingOff { .. } => "backing_off",
            Self::Stopped { .. } => "stopped",
        }
    }
}

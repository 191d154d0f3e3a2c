//! Results as plain data: the detections of one frame, a stream's status and what sinks
//! receive. How they travel (broadcasts, sink queues) is [`crate::fanout`]'s business.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use peregrine_types::{ClassNames, Detection};

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

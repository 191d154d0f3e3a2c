//! A stream's per-frame analytics without its thread and without pictures, for benches
//! and tools outside the crate: what the analytics thread runs on each frame (tracking,
//! zones and lines, object events and updates), minus the JPEG encoding of snapshots,
//! which happens per event rather than per frame.

use std::sync::Arc;

use peregrine_types::{BBox, ClassNames};

use super::config::AnalyticsConfig;
use super::snapshot::Overlay;
use super::stream::{SnapshotSource, StreamAnalytics};
use crate::event::{DetectionEvent, ObjectEvent};

/// One stream's [`StreamAnalytics`] behind a public door.
pub struct FrameAnalytics {
    inner: StreamAnalytics,
}

impl FrameAnalytics {
    /// With the model's class names; a config that does not validate is refused with the
    /// reason.
    pub fn new(config: AnalyticsConfig, names: ClassNames) -> Result<Self, String> {
        config.validate()?;
        Ok(Self {
            inner: StreamAnalytics::new(config, names),
        })
    }

    /// One frame: sets `event.track_ids` and returns the frame's object events.
    pub fn observe(&mut self, event: &mut DetectionEvent) -> Vec<ObjectEvent> {
        self.inner.observe(event, &mut NoPictures)
    }

    /// Ends every live track (their `object.end`s).
    pub fn finish(&mut self) -> Vec<ObjectEvent> {
        self.inner.finish()
    }
}

/// Takes no snapshots.
struct NoPictures;

impl SnapshotSource for NoPictures {
    fn snapshot(&mut self, _overlay: &Overlay<'_>, _focus: Option<BBox>) -> Option<Arc<Vec<u8>>> {
        None
    }
}
